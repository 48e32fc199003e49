"""Prompts' keys and values kept between requests, so that a prompt which begins as an earlier
one did (a chat's system prompt, the earlier turns of a conversation) runs only its new tokens.

In a causal model the keys and values at positions 0 … L−1 depend on the first L tokens only:

    K[:L], V[:L] of  t₁ … t_L t_{L+1} …  =  K[:L], V[:L] of  t₁ … t_L

so once a prompt has been prefilled, any later prompt that shares its first L tokens can start
from those L columns of its cache and prefill the rest. Each entry is one prompt's cache, every
layer's ``(1, kv_heads, length, d_k)`` keys and values in the cache's own dtype; the entries
kept are the most recently used that fit ``budget_bytes`` (an entry is a copy: the batch's own
cache moves on). The engine asks :meth:`longest` before a prefill and :meth:`store` after it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the CLI reads DEFAULT_MB without importing torch)
    from torch import Tensor

Layers = list[tuple["Tensor", "Tensor"]]
DEFAULT_MB = 256  # what a server keeps unless told otherwise (serve --prompt-cache)


def _common(a: tuple[int, ...], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """The keys and values of recent prompts, at most ``budget_bytes`` of them."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"a prompt cache's budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = budget_bytes
        self.used = 0
        self._entries: OrderedDict[tuple[int, ...], tuple[Layers, int]] = OrderedDict()
        self.reused = 0  # prompt tokens not prefilled thanks to an entry (tests, logs)

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: list[int]) -> tuple[int, Layers | None]:
        """The most leading tokens of ``ids`` that an entry holds, at most ``len(ids) − 1``
        (the last token must run, for the next token's logits), and that entry's layers (whose
        first columns are those tokens'); ``(0, None)`` when none shares a token."""
        best, layers, key = 0, None, None
        for prompt, (entry, _) in self._entries.items():
            n = min(_common(prompt, ids), len(ids) - 1)
            if n > best:
                best, layers, key = n, entry, prompt
        if key is not None:
            self._entries.move_to_end(key)
        return best, layers

    def admits(self, ids: list[int], size: int) -> bool:
        """Whether :meth:`store` would keep ``ids``'s keys and values of ``size`` bytes (so
        that the caller copies them only then): not held yet, and within the budget."""
        return tuple(ids) not in self._entries and size <= self.budget

    def store(self, ids: list[int], layers: Layers) -> None:
        """Keep ``layers`` (every layer's ``(1, kv_heads, len(ids), d_k)`` keys and values) as
        ``ids``'s entry, the least recently used going until the budget holds; an entry larger
        than the whole budget is not kept, and entries that are the start of ``ids`` (a
        conversation's earlier turns) go, as ``ids``'s entry holds all they do."""
        key = tuple(ids)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for k, v in layers)
        if not self.admits(ids, size):
            if key in self._entries:
                self._entries.move_to_end(key)
            return
        for prompt in [p for p in self._entries if len(p) < len(key) and key[:len(p)] == p]:
            self.used -= self._entries.pop(prompt)[1]
        while self.used + size > self.budget:
            _, (_, freed) = self._entries.popitem(last=False)
            self.used -= freed
        self._entries[key] = (layers, size)
        self.used += size

    def clear(self) -> None:
        """Forget every entry (the engine stopped)."""
        self._entries.clear()
        self.used = 0


__all__ = ["DEFAULT_MB", "PromptCache"]
