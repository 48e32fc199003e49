"""CoNLL files for named entities: one word a line, its tag in the last column, a blank line
between sentences, ``-DOCSTART-`` lines between documents (CoNLL-2003, Tjong Kim Sang & De
Meulder 2003)::

    EU NNP B-NP B-ORG
    rejects VBZ B-VP O
    German JJ B-NP B-MISC

Tags follow the BIO scheme: ``B-TYPE`` begins an entity, ``I-TYPE`` continues it, ``O`` is
outside every entity. :func:`entities` turns a tag sequence into entity spans as conlleval and
seqeval's default mode read it: an ``I-TYPE`` that does not continue an entity of its type
begins one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from attnlab.config import read_text
from attnlab.errors import BadInput

_TAG = re.compile(r"O|[BI]-\S+")


@dataclass(frozen=True)
class Sentence:
    """One sentence: its words and their BIO tags (same length)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]


def read_conll(path: str | os.PathLike) -> list[Sentence]:
    """The sentences of a CoNLL file; every line must have as many columns as the first one,
    and every tag must be BIO (``O``, ``B-TYPE``, ``I-TYPE``), else one error naming the file
    and line."""
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    columns = None
    for n, line in enumerate(read_text(path, "CoNLL file").splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append(Sentence(tuple(words), tuple(tags)))
                words, tags = [], []
            continue
        if columns is None:
            if len(fields) < 2:
                raise BadInput(f"{path}:{n}: expected a word and a tag, got {line.strip()!r}")
            columns = len(fields)
        if len(fields) != columns:
            raise BadInput(f"{path}:{n}: expected {columns} columns (as on the first line), "
                           f"got {len(fields)}")
        tag = fields[-1]
        if not _TAG.fullmatch(tag):
            raise BadInput(f"{path}:{n}: tag {tag!r} is not in the BIO scheme (O, B-TYPE, "
                           "I-TYPE)")
        words.append(fields[0])
        tags.append(tag)
    if words:
        sentences.append(Sentence(tuple(words), tuple(tags)))
    if not sentences:
        raise BadInput(f"{path}: no sentences")
    return sentences


def entities(tags: list[str] | tuple[str, ...]) -> list[tuple[str, int, int]]:
    """Entity spans ``(type, start, end)`` (``end`` exclusive) of a BIO tag sequence.

    ``B-X`` always begins an entity; ``I-X`` continues the entity before it if that one is of
    type X, otherwise it begins one; ``O`` ends any entity.
    """
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, name = tag.partition("-")
        if kind is not None and (prefix != "I" or name != kind):  # the open entity ends
            spans.append((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = name, i
    if kind is not None:
        spans.append((kind, start, len(tags)))
    return spans
