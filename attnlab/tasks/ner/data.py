"""CoNLL files for named entities, and the rows a model trains on.

One word a line, its tag in the last column, a blank line between sentences, ``-DOCSTART-``
lines between documents (CoNLL-2003, Tjong Kim Sang & De Meulder 2003)::

    EU NNP B-NP B-ORG
    rejects VBZ B-VP O
    German JJ B-NP B-MISC

Tags follow the BIO scheme: ``B-TYPE`` begins an entity, ``I-TYPE`` continues it, ``O`` is
outside every entity (:func:`attnlab.tasks.ner.predict.entities` reads the spans).

A sentence becomes chunks of whole words framed ``[CLS] … [SEP]`` (:class:`Pieces`), each
word labelled at its first piece and -100 (ignored by the loss) at its others.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from attnlab.data.labelled import IGNORE
from attnlab.errors import BadInput, MissingFile
from attnlab.files import read_text

_TAG = re.compile(r"O|[BI]-\S+")
SPLITS = ("train", "dev", "test")  # DIR/train.txt, DIR/dev.txt, DIR/test.txt


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


def conll_files(folder: str | Path) -> dict[str, Path]:
    """The CoNLL files of a data folder: ``train.txt`` (required), ``dev.txt`` and
    ``test.txt`` (each optional)."""
    folder = Path(folder)
    if not (folder / "train.txt").is_file():
        raise MissingFile(f"{folder}: no train.txt (a folder with train.txt, dev.txt and "
                          "test.txt in CoNLL format)")
    return {split: folder / f"{split}.txt" for split in SPLITS
            if (folder / f"{split}.txt").is_file()}


def tag_set(sentences: list[Sentence]) -> list[str]:
    """The BIO tags of the entity types in use: ``O``, then ``B-X`` and ``I-X`` for each type
    X in alphabetical order (a fixed order, so the label ids of a run do not depend on the
    data's order; both tags of a type, so a development file may hold an ``I-X`` the
    training file happens not to)."""
    types = sorted({t[2:] for s in sentences for t in s.tags if t != "O"})
    return ["O"] + [f"{p}-{kind}" for kind in types for p in ("B", "I")]


@dataclass(frozen=True)
class Pieces:
    """One chunk of a sentence as the model reads it: ``ids`` framed ``[CLS] … [SEP]`` and,
    for each position, the index of its word in the sentence (None for [CLS] and [SEP])."""

    ids: list[int]
    word_of: list[int | None]

    def first_pieces(self) -> list[tuple[int, int]]:
        """``(position, word)`` of each word's first piece."""
        seen, out = set(), []
        for pos, word in enumerate(self.word_of):
            if word is not None and word not in seen:
                seen.add(word)
                out.append((pos, word))
        return out

    def labels(self, word_labels: list[int]) -> list[int]:
        """The training labels: a word's label at its first piece, :data:`IGNORE` elsewhere."""
        out = [IGNORE] * len(self.ids)
        for pos, word in self.first_pieces():
            out[pos] = word_labels[word]
        return out


def word_pieces(tokenizer, sentences: list[list[str]], max_len: int) -> list[list[Pieces]]:
    """Each sentence (a list of words) as chunks of whole words whose pieces fit ``max_len``
    with the frame; a single word longer than that keeps its first ``max_len − 2`` pieces."""
    encodings = tokenizer.backend.encode_batch(sentences, is_pretokenized=True,
                                               add_special_tokens=False)
    room = max_len - 2
    out = []
    for words, enc in zip(sentences, encodings, strict=True):
        per_word: list[list[int]] = [[] for _ in words]
        for piece, word in zip(enc.ids, enc.word_ids, strict=True):
            if word is not None:
                per_word[word].append(piece)
        chunks, ids, word_of = [], [], []
        for w, pieces in enumerate(per_word):
            pieces = pieces[:room] or [tokenizer.unk_id]  # a word of no pieces: one [UNK]
            if len(ids) + len(pieces) > room:
                chunks.append(_framed(tokenizer, ids, word_of))
                ids, word_of = [], []
            ids += pieces
            word_of += [w] * len(pieces)
        chunks.append(_framed(tokenizer, ids, word_of))
        out.append(chunks)
    return out


def _framed(tokenizer, ids: list[int], word_of: list[int]) -> Pieces:
    return Pieces([tokenizer.cls_id, *ids, tokenizer.sep_id], [None, *word_of, None])


def encode_sentences(sentences: list[Sentence], tokenizer, labels: list[str],
                     max_len: int) -> list[tuple[list[int], list[int]]]:
    """Training rows ``(ids, labels)``: each sentence's chunks framed ``[CLS] … [SEP]``, the
    word's tag index at its first subword and -100 (ignored) at the others. A tag outside
    ``labels`` is one error naming it."""
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
