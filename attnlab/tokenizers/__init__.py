"""attnlab.tokenizers: one interface, several ways of cutting text into ids."""

from __future__ import annotations

import json
import os

from attnlab.tokenizers.base import SPECIALS, Tokenizer
from attnlab.tokenizers.bpe import BPETokenizer
from attnlab.tokenizers.char import CharTokenizer
from attnlab.tokenizers.word import WordTokenizer
from attnlab.tokenizers.wordpiece import WordPieceTokenizer

KINDS: dict[str, type] = {"char": CharTokenizer, "word": WordTokenizer, "bpe": BPETokenizer,
                         "wordpiece": WordPieceTokenizer}


def tokenizer_from_dict(data: dict) -> Tokenizer:
    kind = data.get("type")
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer type {kind!r}; expected one of {sorted(KINDS)}")
    return KINDS[kind].from_dict(data)


def load(path: str | os.PathLike) -> Tokenizer:
    """Read a tokenizer saved by :meth:`Tokenizer.save`."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid tokenizer JSON ({e.msg})") from None
    return tokenizer_from_dict(data)


__all__ = ["Tokenizer", "BPETokenizer", "WordPieceTokenizer", "CharTokenizer", "WordTokenizer",
           "SPECIALS", "load", "tokenizer_from_dict", "KINDS"]
