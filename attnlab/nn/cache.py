"""Key/value caches for incremental decoding.

When a decoder generates token t, the keys and values of tokens < t do not change (causal
attention), so recomputing them is wasted work. A :class:`KVCache` keeps them in preallocated
storage ``(batch, kv_heads, capacity, d_k)`` and appends the new positions in place; capacity
doubles on overflow so a wrong guess costs a copy, not an error.

Cross-attention keys and values depend only on the encoder output, so a ``static`` cache is
filled once and reused at every step.

Speculative decoding feeds several guessed tokens at once and keeps only those the model
agrees with: :meth:`KVCache.truncate` (and :meth:`SelfAttentionCache.truncate`, every layer)
forgets the positions of the rejected ones.

A compiled decoding step wants the same shapes at every token: a :class:`StaticCache` holds
each layer's keys and values in storage of a fixed capacity, the slot to write given by a
tensor (``generation/compiled.py``).

Sliding-window attention (Mistral: query i sees keys i − W < j ≤ i) never looks further back
than W − 1 tokens, so a :class:`RollingKVCache` holds at most W entries: position p lives in
slot p mod W, and each new token overwrites the one that just left every later window.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention module. ``length`` = number of cached positions.
    ``dtype``: the storage's (a 16-bit cache under float32 activations: half the bytes, the
    values rounded as they are stored); None: the keys' own."""

    def __init__(self, capacity: int = 256, static: bool = False,
                 dtype: torch.dtype | None = None):
        self.capacity = capacity
        self.static = static
        self.dtype = dtype
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
        new_k = k.new_empty(b, h, capacity, d, dtype=self.dtype or k.dtype)
        new_v = v.new_empty(b, h, capacity, v.shape[-1], dtype=self.dtype or v.dtype)
        if self.k is not None:
            new_k[:, :, : self.length] = self.k[:, :, : self.length]
            new_v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = new_k, new_v

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding's rejected drafts).

        Resetting ``length`` is enough for a growing cache: entries are kept in order, slot p
        holding position p, and nothing reads past ``length`` — :meth:`append` returns
        ``[:length]`` and writes the next positions over the stale slots. No copy, no zeroing.
        """
        if self.static:
            raise ValueError("a static (cross-attention) cache has no positions to forget")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length

    @property
    def filled(self) -> bool:
        return self.k is not None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: the surviving beams' histories)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class RollingKVCache(KVCache):
    """The keys and values of the last ``window`` positions, in slots ``p mod window``.

    ``length`` counts every position seen. One new token (decoding) is written into its slot
    and attends the whole buffer, in slot order: attention does not care about the order of
    its keys, only the mask does, and :meth:`key_index` tells it where each key came from.
    Several new tokens (a prompt) attend the kept entries in time order followed by
    themselves, and the buffer then keeps the last ``window`` of them.
    """

    def __init__(self, window: int, dtype: torch.dtype | None = None):
        super().__init__(capacity=window, dtype=dtype)
        self.window = window

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` positions; possible only while no slot was reused (at most
        ``window`` positions seen): past that, the dropped positions overwrote keys that the
        kept ones still need. Decode with a growing cache to roll back further."""
        if length < self.length and self.length > self.window:
            raise ValueError(f"a rolling cache of window {self.window} cannot roll back from "
                             f"{self.length} positions to {length}: their slots were reused; "
                             "use new_cache(rolling=False)")
        super().truncate(length)

    def _one_step(self, new: int) -> bool:
        return new == 1 and self.k is not None

    def key_index(self, new: int, device: torch.device | str | None = None) -> Tensor:
        """The sequence index of each key that :meth:`append` of ``new`` tokens returns."""
        t, w = self.length, self.window
        if self._one_step(new):  # slot s holds the latest p <= t with p ≡ s (mod w)
            slots = torch.arange(min(t + 1, w), device=device)
            return t - (t - slots) % w
        return torch.arange(t - min(t, w), t + new, device=device)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        new, t, w = k.shape[2], self.length, self.window
        if self._one_step(new):
            slot = t % w
            self.k[:, :, slot : slot + 1] = k
            self.v[:, :, slot : slot + 1] = v
            self.length = t + 1
            n = min(t + 1, w)
            return self.k[:, :, :n], self.v[:, :, :n]
        if self.dtype is not None:  # the prompt attends its keys as stored, as in KVCache
            k, v = k.to(self.dtype).to(k.dtype), v.to(self.dtype).to(v.dtype)
        kept = min(t, w)
        if kept:  # the kept entries in time order: slots (t − kept .. t − 1) mod w
            order = torch.arange(t - kept, t, device=k.device) % w
            k = torch.cat([self.k.index_select(2, order).to(k.dtype), k], dim=2)
            v = torch.cat([self.v.index_select(2, order).to(v.dtype), v], dim=2)
        self.length = t + new
        keep = min(self.length, w)
        if self.k is None:
            self._grow(k, v, w)
        slots = torch.arange(self.length - keep, self.length, device=k.device) % w
        self.k[:, :, slots] = k[:, :, -keep:].to(self.k.dtype)
        self.v[:, :, slots] = v[:, :, -keep:].to(self.v.dtype)
        return k, v


class SelfAttentionCache(list):
    """One :class:`KVCache` per layer of a decoder-only stack (GPT, Llama: self-attention
    only), rolling ones of ``window`` entries for sliding-window attention; ``length`` is the
    number of positions decoded."""

    def __init__(self, n_layers: int, capacity: int = 256, window: int | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__(KVCache(capacity, dtype=dtype) if window is None
                         else RollingKVCache(window, dtype) for _ in range(n_layers))

    @property
    def length(self) -> int:
        return self[0].length if self else 0

    def key_index(self, new: int, device: torch.device | str | None = None) -> Tensor | None:
        """Sequence indices of the keys the layers attend after ``new`` more tokens: ``(k_len,)``
        for rolling caches, None for growing ones (keys ``0 .. length + new − 1`` in order)."""
        first = self[0] if self else None
        return first.key_index(new, device) if isinstance(first, RollingKVCache) else None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions in every layer (:meth:`KVCache.truncate`)."""
        for layer in self:
            layer.truncate(length)

    def reorder(self, index: Tensor) -> None:
        for layer in self:
            layer.reorder(index)


class StaticKVCache:
    """One layer's keys and values in storage of a fixed size ``(batch, kv_heads, capacity,
    d_k)``, position slot by slot, written where the owning cache's ``slots`` tensor says. Every
    step then sees the same shapes and reads its slot from a tensor, so a compiled one-token
    step (``torch.compile``) serves every token with no recompilation. The attention reads all
    ``capacity`` slots; the step's mask hides those not written yet."""

    static = False  # (a cross-attention cache is the other kind of "static")

    def __init__(self, k: Tensor, v: Tensor, owner: StaticCache | StaticDecoderCache):
        self.k, self.v, self.owner = k, v, owner

    @classmethod
    def copy_of(cls, layer: KVCache, capacity: int,
                owner: StaticCache | StaticDecoderCache) -> StaticKVCache:
        """``layer``'s ``length`` positions in slots 0 .. length − 1 of new storage, zero past
        them (masked keys must not be NaN)."""
        n = layer.length
        if capacity < n:
            raise ValueError(f"a static cache of {capacity} slots cannot hold {n} positions")
        k, v = layer.k[:, :, :n], layer.v[:, :, :n]
        big_k = k.new_zeros(*k.shape[:2], capacity, k.shape[3])
        big_v = v.new_zeros(*v.shape[:2], capacity, v.shape[3])
        big_k[:, :, :n], big_v[:, :, :n] = k, v
        return cls(big_k, big_v, owner)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v (batch, kv_heads, new, d_k)`` into slots ``owner.slots (new,)``; return
        the whole storage ``(batch, kv_heads, capacity, d_k)``."""
        self.k.index_copy_(2, self.owner.slots, k.to(self.k.dtype))
        self.v.index_copy_(2, self.owner.slots, v.to(self.v.dtype))
        return self.k, self.v

    def reorder(self, index: Tensor, filled: int | None = None) -> None:
        """Keep batch rows ``index``, in place: a compiled step keeps reading the same storage.
        ``filled``: only the first slots hold keys, the rest need not move."""
        _reorder_(self, index, filled)


def _reorder_(cache: KVCache | StaticKVCache, index: Tensor, filled: int | None = None) -> None:
    """Batch rows ``index`` of ``cache.k`` and ``cache.v`` (their first ``filled`` positions),
    written back into them."""
    for t in (cache.k, cache.v):
        part = t if filled is None else t[:, :, :filled]
        part.copy_(part.index_select(0, index))


class _Slots:
    """What both static caches share: ``capacity``, and ``slots``, the slot the next token is
    written to, a ``(1,)`` tensor the decoding loop advances in place. ``length`` is
    ``capacity − 1``, so that a stack sizing its position bias by ``length + 1`` keys spans
    every slot."""

    capacity: int
    slots: Tensor

    def _start(self, storage: Tensor, start: int) -> None:
        self.capacity = storage.shape[2]
        self.slots = torch.tensor([start], device=storage.device)

    @property
    def length(self) -> int:
        return self.capacity - 1


class StaticCache(_Slots, list):
    """A decoder-only stack's :class:`StaticKVCache` per layer, made from the growing cache that
    the prompt filled (:meth:`from_cache`): slot p holds position p (left padding included).
    A stack computing a position bias (ALiBi) for one query spans all ``capacity`` slots as if
    they ended at the query, which equals the bias of the written ones up to a constant per
    row, and softmax ignores a constant."""

    @classmethod
    def of(cls, layers: list[tuple[Tensor, Tensor]], start: int) -> StaticCache:
        """Each layer's storage ``(batch, kv_heads, capacity, d_k)`` as given; the next slot
        ``start``."""
        static = cls()
        static.extend(StaticKVCache(k, v, static) for k, v in layers)
        static._start(layers[0][0], start)
        return static

    @classmethod
    def from_cache(cls, cache: SelfAttentionCache, capacity: int) -> StaticCache:
        """The growing ``cache`` (``length`` positions, never a rolling one) copied into
        storage of ``capacity`` slots."""
        if any(isinstance(layer, RollingKVCache) for layer in cache):
            raise ValueError("a static cache is made from a growing cache, not a rolling one")
        static = cls()
        static.extend(StaticKVCache.copy_of(layer, capacity, static) for layer in cache)
        static._start(static[0].k, cache.length)
        return static


class StaticLayerCache:
    """An encoder–decoder decoder layer's caches for a compiled step: self-attention in
    static slots, cross-attention as the first (eager) step filled it."""

    def __init__(self, self_attn: StaticKVCache, cross_attn: KVCache):
        self.self_attn, self.cross_attn = self_attn, cross_attn

    def reorder(self, index: Tensor, filled: int | None = None) -> None:
        self.self_attn.reorder(index, filled)
        _reorder_(self.cross_attn, index)


class StaticDecoderCache(_Slots, list):
    """An encoder–decoder's :class:`StaticLayerCache` per layer, made from the
    :class:`DecoderCache` of the first decoding step (:meth:`from_cache`). Slot j holds
    position j and ``key_positions`` says so (``(capacity,)``): T5's relative bias is not a
    constant shift of the distance, so it needs each key's true position."""

    key_positions: Tensor

    @classmethod
    def from_cache(cls, cache: DecoderCache, capacity: int) -> StaticDecoderCache:
        if not all(layer.cross_attn.filled for layer in cache):
            raise ValueError("a static decoder cache is made after the first decoding step")
        static = cls()
        for layer in cache:
            cross = KVCache(static=True)
            cross.k, cross.v, cross.length = layer.cross_attn.k, layer.cross_attn.v, \
                layer.cross_attn.length
            static.append(StaticLayerCache(
                StaticKVCache.copy_of(layer.self_attn, capacity, static), cross))
        static._start(static[0].self_attn.k, cache.length)
        static.key_positions = torch.arange(capacity, device=static.slots.device)
        return static

    def reorder(self, index: Tensor, filled: int | None = None) -> None:
        """Keep batch rows ``index``; ``filled``: the slots written so far (the rest need not
        move)."""
        for layer in self:
            layer.reorder(index, filled)


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


__all__ = ["KVCache", "RollingKVCache", "SelfAttentionCache", "StaticKVCache", "StaticCache",
           "StaticLayerCache", "StaticDecoderCache", "LayerCache", "DecoderCache"]
