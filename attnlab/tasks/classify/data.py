"""Labelled texts for sequence classification: JSON lines in, a fixed split, token rows out.

The split is a function of each example's id alone (SHA-1 of the id, as a number in [0, 1)),
so, given an id field, it never changes when the file is reordered or grows, and no example
moves between training and test. (Without one, the line number stands in as the id.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import BadInput, MissingFile
from attnlab.files import parse_json, text_lines


@dataclass
class Example:
    id: str
    text: str
    label: str


def read_labelled(path: str | Path, text_field: str, label_field: str,
                  id_field: str = "id") -> list[Example]:
    """Examples from a ``.jsonl`` or ``.jsonl.gz`` file. ``text_field`` may name several fields
    joined by commas (``subject,body``); their values are joined with a newline. Without an
    ``id_field`` the line number is the id."""
    path = Path(path)
    if not path.exists():
        raise MissingFile(f"data file not found: {path}")
    fields = [f.strip() for f in text_field.split(",") if f.strip()]
    examples = []
    for n, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        row = parse_json(line, path, line=n)
        for name in [*fields, label_field]:
            if name not in row:
                raise BadInput(f"{path}:{n}: field {name!r} missing "
                               f"(fields: {', '.join(sorted(row))})")
        text = "\n".join(str(row[name] or "") for name in fields)
        examples.append(Example(str(row.get(id_field, n)), text, str(row[label_field])))
    if not examples:
        raise BadInput(f"{path}: no examples")
    return examples


def hash_fraction(key: str) -> float:
    """A stable number in [0, 1) for ``key`` (the first 8 bytes of its SHA-1)."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big") / 2**64


def split_by_hash(examples: list[Example], val: float = 0.1,
                  test: float = 0.1) -> tuple[list[Example], list[Example], list[Example]]:
    """``(train, validation, test)``: test where hash < test, validation where hash < test+val."""
    parts: tuple[list[Example], list[Example], list[Example]] = ([], [], [])
    for e in examples:
        h = hash_fraction(e.id)
        parts[2 if h < test else 1 if h < test + val else 0].append(e)
    return parts


def encode_examples(examples: list[Example], tokenizer, labels: list[str],
                    max_len: int) -> list[tuple[list[int], int]]:
    """``[CLS] text [SEP]`` ids cut to ``max_len`` (keeping the final [SEP]) and label index."""
    index = {name: i for i, name in enumerate(labels)}
    out = []
    for e in examples:
        if e.label not in index:
            raise BadInput(f"example {e.id}: label {e.label!r} is not one of {labels}")
        ids = tokenizer.encode_single(e.text)
        if len(ids) > max_len:
            ids = ids[: max_len - 1] + [tokenizer.sep_id]
        out.append((ids, index[e.label]))
    return out
