"""attnlab.tokenizers: one interface, several ways of cutting text into ids."""

from __future__ import annotations

import os

from attnlab.errors import BadInput
from attnlab.files import read_json
from attnlab.tokenizers.base import (
    KINDS,
    SPECIALS,
    CharTokenizer,
    TextStats,
    Tokenizer,
    VocabTokenizer,
    WordTokenizer,
    pad,
    text_stats,
    tokenizer_from_dict,
)
from attnlab.tokenizers.bpe import BPETokenizer
from attnlab.tokenizers.wordpiece import WordPieceTokenizer, learn_wordpiece


def load(path: str | os.PathLike) -> Tokenizer:
    """Read a tokenizer saved by :meth:`Tokenizer.save`."""
    data = read_json(path, "tokenizer JSON", "tokenizer file")
    try:
        return tokenizer_from_dict(data)
    except BadInput as e:
        raise BadInput(f"{path}: {e}") from None


__all__ = ["Tokenizer", "VocabTokenizer", "BPETokenizer", "WordPieceTokenizer", "CharTokenizer",
           "WordTokenizer", "SPECIALS", "load", "tokenizer_from_dict", "KINDS", "pad", "TextStats",
           "text_stats", "learn_wordpiece"]
