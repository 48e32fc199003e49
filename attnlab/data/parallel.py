"""Reading text: whole files and lines (plain or ``.gz``, UTF-8, checked), and line-aligned
parallel text, where line i of the source file translates line i of the target."""

from __future__ import annotations

import gzip
import os
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from attnlab import config
from attnlab.errors import BadInput, MissingFile


def text_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a plain or ``.gz`` UTF-8 file (with their newlines); a line that is not
    UTF-8, or a damaged ``.gz``, is a one-line error naming the file and the line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"file not found: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    read = 0  # lines read so far: an error is on line read + 1
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                read += 1
                yield line
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}:{read + 1}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a damaged .gz stream
        raise BadInput(f"{path}:{read + 1}: cannot be read ({e})") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a plain or ``.gz`` UTF-8 file, without their newlines."""
    return [line.rstrip("\n").rstrip("\r") for line in text_lines(path)]


def read_text(path: str | os.PathLike) -> str:
    """A whole UTF-8 text file; a missing, non-UTF-8 or empty file is a one-line error."""
    text = config.read_text(path, "text file")
    if not text.strip():
        raise BadInput(f"{path}: the text file is empty")
    return text


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
    train: list[tuple[str, str]]
    test: list[tuple[str, str]]


def load_corpus(task: str | None, src: str | None, tgt: str | None, n_train: int = 200_000,
                n_test: int = 500, seed: int = 0) -> Corpus:
    """The numbers task, or parallel files (a seeded shuffle; ``n_test`` pairs, at most a
    tenth, held out)."""
    if task == "numbers":
        from attnlab.data.numbers import numbers_corpus

        train, test = numbers_corpus(n_train, n_test, seed)
        return Corpus(train, test)
    if task is not None:
        raise BadInput(f"unknown task {task!r}; the built-in task is 'numbers'")
    if not (src and tgt):
        raise BadInput("give --task numbers, or both --src FILE and --tgt FILE")
    pairs = [p for p in read_parallel(src, tgt) if p[0] and p[1]]
    random.Random(seed).shuffle(pairs)
    n_test = min(n_test, len(pairs) // 10)
    return Corpus(pairs[n_test:], pairs[:n_test])
