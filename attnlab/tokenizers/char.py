"""Character-level tokenizer: every character is a token."""

from __future__ import annotations

from collections.abc import Iterable

from attnlab.tokenizers.base import Tokenizer


class CharTokenizer(Tokenizer):
    """One id per character seen in training; unseen characters map to ``<unk>``."""

    kind = "char"

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        return cls(sorted(chars))

    def split(self, text: str) -> list[str]:
        return list(text)

    def join(self, pieces: list[str]) -> str:
        return "".join(pieces)
