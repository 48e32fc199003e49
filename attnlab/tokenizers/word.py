"""Word-level tokenizer: words and punctuation marks are tokens.

``"forty-two"`` splits into ``["forty", "-", "two"]``; decoding joins with single spaces and
then re-attaches hyphens and closing punctuation, so decode(encode(text)) == text for text
written in that usual spacing.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from attnlab.tokenizers.base import Tokenizer

_TOKEN = re.compile(r"\w+|[^\w\s]")
_ATTACH = re.compile(r" ?(-) ?| ([.,!?;:%)\]])|([(\[]) ")


class WordTokenizer(Tokenizer):
    """Vocabulary of the ``max_size`` most frequent words with count >= ``min_count``."""

    kind = "word"

    @classmethod
    def train(cls, texts: Iterable[str], max_size: int | None = None,
              min_count: int = 1) -> WordTokenizer:
        counts = Counter(tok for t in texts for tok in _TOKEN.findall(t))
        ranked = sorted((w for w, c in counts.items() if c >= min_count),
                        key=lambda w: (-counts[w], w))
        return cls(ranked[:max_size] if max_size else ranked)

    def split(self, text: str) -> list[str]:
        return _TOKEN.findall(text)

    def join(self, pieces: list[str]) -> str:
        text = " ".join(pieces)
        return _ATTACH.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)
