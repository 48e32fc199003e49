"""Key/value caches for incremental decoding.

When a decoder generates token t, the keys and values of tokens < t do not change (causal
attention), so recomputing them is wasted work. A :class:`KVCache` keeps them in preallocated
storage ``(batch, kv_heads, capacity, d_k)`` and appends the new positions in place; capacity
doubles on overflow so a wrong guess costs a copy, not an error.

Cross-attention keys and values depend only on the encoder output, so a ``static`` cache is
filled once and reused at every step.
"""

from __future__ import annotations

from torch import Tensor


class KVCache:
    """Keys and values of one attention module. ``length`` = number of cached positions."""

    def __init__(self, capacity: int = 256, static: bool = False):
        self.capacity = capacity
        self.static = static
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k, v (batch, kv_heads, new, d_k)``; return all cached ``(.., length, d_k)``."""
        if self.static:
            self.k, self.v, self.length = k, v, k.shape[2]
            return k, v
        new = k.shape[2]
        end = self.length + new
        if self.k is None or end > self.k.shape[2]:
            current = 0 if self.k is None else self.k.shape[2]
            self._grow(k, v, max(end, 2 * current, self.capacity))
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _grow(self, k: Tensor, v: Tensor, capacity: int) -> None:
        b, h, _, d = k.shape
        new_k = k.new_empty(b, h, capacity, d)
        new_v = v.new_empty(b, h, capacity, v.shape[-1])
        if self.k is not None:
            new_k[:, :, : self.length] = self.k[:, :, : self.length]
            new_v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = new_k, new_v

    @property
    def filled(self) -> bool:
        return self.k is not None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: the surviving beams' histories)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class SelfAttentionCache(list):
    """One :class:`KVCache` per layer of a decoder-only stack (GPT, Llama: self-attention
    only); ``length`` is the number of positions decoded."""

    def __init__(self, n_layers: int, capacity: int = 256):
        super().__init__(KVCache(capacity) for _ in range(n_layers))

    @property
    def length(self) -> int:
        return self[0].length if self else 0

    def reorder(self, index: Tensor) -> None:
        for layer in self:
            layer.reorder(index)


class LayerCache:
    """The caches of one encoder–decoder decoder layer: self- and cross-attention."""

    def __init__(self, capacity: int = 256):
        self.self_attn = KVCache(capacity)
        self.cross_attn = KVCache(static=True)

    def reorder(self, index: Tensor) -> None:
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)


class DecoderCache(list):
    """One :class:`LayerCache` per layer of an encoder–decoder's decoder; ``length`` is the
    number of positions decoded."""

    def __init__(self, n_layers: int, capacity: int = 256):
        super().__init__(LayerCache(capacity) for _ in range(n_layers))

    @property
    def length(self) -> int:
        return self[0].self_attn.length if self else 0

    def reorder(self, index: Tensor) -> None:
        for layer in self:
            layer.reorder(index)


__all__ = ["KVCache", "SelfAttentionCache", "LayerCache", "DecoderCache"]
