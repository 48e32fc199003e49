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
from attnlab.tagging import entities, word_pieces  # noqa: F401  (entities: re-exported)

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


def encode_sentences(sentences: list[Sentence], tokenizer, labels: list[str],
                     max_len: int) -> list[tuple[list[int], list[int]]]:
    """Training rows ``(ids, labels)``: each sentence's chunks framed ``[CLS] … [SEP]``, the
    word's tag index at its first subword and -100 (ignored) at the others
    (:mod:`attnlab.tagging`). A tag outside ``labels`` is one error naming it."""
    index = {name: i for i, name in enumerate(labels)}
    rows = []
    chunked = word_pieces(tokenizer, [list(s.words) for s in sentences], max_len)
    for sentence, chunks in zip(sentences, chunked, strict=True):
        unknown = [t for t in sentence.tags if t not in index]
        if unknown:
            raise BadInput(f"tag {unknown[0]!r} is not one of the training tags {labels}")
        word_labels = [index[t] for t in sentence.tags]
        rows += [(chunk.ids, chunk.labels(word_labels)) for chunk in chunks]
    return rows


def tag_set(sentences: list[Sentence]) -> list[str]:
    """The BIO tags of the entity types in use: ``O``, then ``B-X`` and ``I-X`` for each type
    X in alphabetical order (a fixed order, so the label ids of a run do not depend on the
    data's order; both tags of a type, so a development file may hold an ``I-X`` the
    training file happens not to)."""
    types = sorted({t[2:] for s in sentences for t in s.tags if t != "O"})
    return ["O"] + [f"{p}-{kind}" for kind in types for p in ("B", "I")]
