"""Parallel corpora: line-aligned text, where line i of the source file translates line i of
the target (read through :mod:`attnlab.files`), length filtering, and the corpus a translation
recipe trains and validates on."""

from __future__ import annotations

import os
from dataclasses import dataclass

from attnlab.errors import BadInput
from attnlab.files import read_lines


def read_parallel(src_path: str | os.PathLike,
                  tgt_path: str | os.PathLike) -> list[tuple[str, str]]:
    """Pairs of lines; a clear error when the files differ in length or are empty."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise BadInput(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
            "parallel files must be line-aligned"
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(src, tgt, strict=True)]
    if not any(s and t for s, t in pairs):
        raise BadInput(f"empty corpus: {src_path} and {tgt_path} hold no sentence pairs")
    return pairs


@dataclass
class FilterReport:
    kept: int
    dropped_empty: int
    dropped_long: int
    max_len: int

    def __str__(self) -> str:
        return (f"kept {self.kept} pairs; dropped {self.dropped_empty} with an empty side and "
                f"{self.dropped_long} longer than {self.max_len} tokens")


def filter_by_length(src: list[list[int]], tgt: list[list[int]], max_len: int):
    """Keep pairs whose both sides are non-empty and at most ``max_len`` tokens.

    Returns ``(src, tgt, report)``; the report says how many were dropped and why.
    """
    keep_src, keep_tgt, empty, long = [], [], 0, 0
    for s, t in zip(src, tgt, strict=True):
        if not s or not t:
            empty += 1
        elif len(s) > max_len or len(t) > max_len:
            long += 1
        else:
            keep_src.append(s)
            keep_tgt.append(t)
    return keep_src, keep_tgt, FilterReport(len(keep_src), empty, long, max_len)


@dataclass
class Corpus:
    """Training pairs and held-out pairs (``test``; none when no validation data was asked
    for). ``held_out`` says where the held-out pairs come from, for the ``data:`` line."""

    train: list[tuple[str, str]]
    test: list[tuple[str, str]]
    held_out: str = "no validation data"


def load_corpus(task: str | None, src: str | None, tgt: str | None, n_train: int = 200_000,
                n_test: int | None = None, seed: int = 0, valid_src: str | None = None,
                valid_tgt: str | None = None) -> Corpus:
    """The numbers task (``n_test`` numbers held out, 500 by default), or parallel files:
    all their pairs train (in file order) unless validation data is asked for, either the
    last ``n_test`` pairs of the files held out or separate ``valid_src`` and ``valid_tgt``
    files. Pairs with an empty side are left out. Returns the :class:`Corpus`."""
    valid = valid_src or valid_tgt
    if n_test is not None and n_test < 0:
        raise BadInput(f"the number of held-out pairs must be >= 0, got {n_test}")
    if task == "numbers":
        from attnlab.data.numbers import numbers_corpus

        if valid:
            raise BadInput("the numbers task holds out its own numbers: give --holdout N, "
                           "not --valid-src/--valid-tgt")
        n_test = 500 if n_test is None else n_test
        train, test = numbers_corpus(n_train, n_test, seed)
        return Corpus(train, test, f"{len(test)} held-out numbers never seen in training")
    if task is not None:
        raise BadInput(f"unknown task {task!r}; the built-in task is 'numbers'")
    if not (src and tgt):
        raise BadInput("give --task numbers, or both --src FILE and --tgt FILE")
    if valid and not (valid_src and valid_tgt):
        raise BadInput("give both --valid-src FILE and --valid-tgt FILE")
    if valid and n_test:
        raise BadInput("give --valid-src/--valid-tgt or --holdout N, not both")
    pairs = _sentence_pairs(src, tgt)
    if valid:
        test = _sentence_pairs(valid_src, valid_tgt)
        return Corpus(pairs, test, f"validation: {len(test)} pairs from {valid_src} and "
                                   f"{valid_tgt}")
    if not n_test:
        return Corpus(pairs, [])
    if n_test >= len(pairs):
        raise BadInput(f"holding out {n_test} pairs leaves none to train on: {src} and {tgt} "
                       f"hold {len(pairs)} sentence pairs")
    return Corpus(pairs[:-n_test], pairs[-n_test:],
                  f"validation: the last {n_test} pairs of {src} and {tgt}, held out")


def _sentence_pairs(src: str | os.PathLike, tgt: str | os.PathLike) -> list[tuple[str, str]]:
    """The pairs of two parallel files whose sides are both non-empty."""
    return [p for p in read_parallel(src, tgt) if p[0] and p[1]]
