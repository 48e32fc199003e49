"""Line-aligned parallel text: line i of the source file translates line i of the target."""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a plain or ``.gz`` UTF-8 file, without their newlines."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"file not found: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n").rstrip("\r") for line in f]
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read as UTF-8 text ({e})") from None


def read_parallel(src_path: str | os.PathLike,
                  tgt_path: str | os.PathLike) -> list[tuple[str, str]]:
    """Pairs of lines; a clear error when the files differ in length or are empty."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
            "parallel files must be line-aligned"
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(src, tgt, strict=True)]
    if not any(s and t for s, t in pairs):
        raise ValueError(f"empty corpus: {src_path} and {tgt_path} hold no sentence pairs")
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
