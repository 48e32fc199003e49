"""Labelled texts (or pairs of texts) for sequence classification: JSON lines in, a fixed
split, token rows out.

A text is read as ``[CLS] text [SEP]``; a pair as the family's pair format, ``[CLS] A [SEP] B
[SEP]`` with token types 0 … 0 1 … 1 (BERT's WordPiece), ``<s> A </s></s> B </s>`` with none
(RoBERTa), cut to the longest input as transformers' tokenizers cut a pair (``truncation``).

The split is a function of each example's id alone (SHA-1 of the id, as a number in [0, 1)),
so, given an id field, it never changes when the file is reordered or grows, and no example
moves between training and test. (Without one, the line number stands in as the id.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.labelled import LabelledBatches, padded
from attnlab.data.stream import LabelledBatch
from attnlab.errors import BadInput, MissingFile
from attnlab.files import parse_json, text_lines
from attnlab.tokenizers.wordpiece import PAIR_TRUNCATIONS as TRUNCATIONS  # noqa: F401  (public)


@dataclass
class Example:
    id: str
    text: str
    label: str
    pair: str | None = None  # the second text of a pair


def read_labelled(path: str | Path, text_field: str, label_field: str,
                  id_field: str = "id", pair_field: str | None = None) -> list[Example]:
    """Examples from a ``.jsonl`` or ``.jsonl.gz`` file. ``text_field`` may name several fields
    joined by commas (``subject,body``); their values are joined with a newline. Without an
    ``id_field`` the line number is the id. ``pair_field``: the second text of a pair."""
    path = Path(path)
    if not path.exists():
        raise MissingFile(f"data file not found: {path}")
    fields = [f.strip() for f in text_field.split(",") if f.strip()]
    examples = []
    for n, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        row = parse_json(line, path, line=n)
        for name in [*fields, label_field, *([pair_field] if pair_field else [])]:
            if name not in row:
                raise BadInput(f"{path}:{n}: field {name!r} missing "
                               f"(fields: {', '.join(sorted(row))})")
        text = "\n".join(str(row[name] or "") for name in fields)
        pair = str(row[pair_field] or "") if pair_field else None
        examples.append(Example(str(row.get(id_field, n)), text, str(row[label_field]), pair))
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


def label_index(e: Example, labels: list[str]) -> int:
    if e.label not in labels:
        raise BadInput(f"example {e.id}: label {e.label!r} is not one of {labels}")
    return labels.index(e.label)


def encode_examples(examples: list[Example], tokenizer, labels: list[str],
                    max_len: int) -> list[tuple[list[int], int]]:
    """``[CLS] text [SEP]`` ids cut to ``max_len`` (keeping the final [SEP]) and label index."""
    out = []
    for e in examples:
        ids = tokenizer.encode_single(e.text)
        if len(ids) > max_len:
            ids = ids[: max_len - 1] + [tokenizer.sep_id]
        out.append((ids, label_index(e, labels)))
    return out


# --- pairs -----------------------------------------------------------------------------------
def encode_pairs(examples: list[Example], tokenizer, labels: list[str] | None, max_len: int,
                 truncation: str = "longest_first") -> list[tuple[list[int], list[int], int]]:
    """``(ids, token_types, label index)`` of each pair, in the family's pair format, cut to
    ``max_len`` (``truncation``: :data:`TRUNCATIONS`); without ``labels``, the label is 0."""
    return [(*tokenizer.encode_pair(e.text, e.pair or "", max_len, truncation),
             label_index(e, labels) if labels is not None else 0) for e in examples]


def collate_pairs(rows: list[tuple[list[int], list[int], int]], pad_id: int) -> LabelledBatch:
    """``(ids, token_type_ids, attention_mask, labels)``, right-padded (token type 0)."""
    ids, mask = padded([r[0] for r in rows], pad_id)
    types, _ = padded([r[1] for r in rows], 0)
    return LabelledBatch(ids, types, mask, torch.tensor([r[2] for r in rows]))


def fixed_pair_batches(rows, batch_size: int, pad_id: int) -> list[LabelledBatch]:
    """Evaluation batches in a fixed order, by length."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    return [collate_pairs([rows[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class PairBatches(LabelledBatches):
    """Endless shuffled training batches of pairs, as :class:`LabelledBatches` draws them."""

    @staticmethod
    def collate(rows: list, pad_id: int) -> LabelledBatch:
        return collate_pairs(rows, pad_id)
