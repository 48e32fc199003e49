"""attnlab.tokenizers: one interface, several ways of cutting text into ids."""

from __future__ import annotations

import json
import os

from attnlab.errors import BadInput, MissingFile
from attnlab.tokenizers.base import (
    KINDS,
    SPECIALS,
    CharTokenizer,
    Tokenizer,
    VocabTokenizer,
    WordTokenizer,
    pad,
    tokenizer_from_dict,
)
from attnlab.tokenizers.bpe import BPETokenizer
from attnlab.tokenizers.wordpiece import WordPieceTokenizer


def load(path: str | os.PathLike) -> Tokenizer:
    """Read a tokenizer saved by :meth:`Tokenizer.save`."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise MissingFile(f"tokenizer file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}:{e.lineno}: invalid tokenizer JSON ({e.msg})") from None
    return tokenizer_from_dict(data)


__all__ = ["Tokenizer", "VocabTokenizer", "BPETokenizer", "WordPieceTokenizer", "CharTokenizer",
           "WordTokenizer", "SPECIALS", "load", "tokenizer_from_dict", "KINDS", "pad"]
