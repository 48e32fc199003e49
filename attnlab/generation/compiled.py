"""A compiled one-token decoding step for decoder-only models (gpt-fast's recipe).

Eager decoding runs the model's Python code at every token: a dozen small operations a layer,
each dispatched on its own, with its own temporaries. For a small model on a CPU that overhead
is as large as the matrix products themselves. ``torch.compile`` turns one token's forward
pass into a few fused kernels, but only if every token has the same shapes:

    prefill   logits = model(prompt, growing cache)           eager, any length, one pass
    convert   StaticCache.from_cache(cache, capacity)          capacity = prompt + new tokens,
                                                               rounded up to a bucket of 256
    step t    logits = step(token_t, key_mask, cache)          compiled once per (batch, capacity)

The step's inputs keep their shapes from token to token: the cache's storage (``capacity``
slots), the key mask ``(batch, capacity)`` — True at the slots that hold a real token, the new
one included — and the slot to write (a tensor inside the cache). Each row's position is the
count of its real tokens minus one, as :func:`~attnlab.generation.decoder_only.generate`
counts positions under left padding, so the step computes what the eager step computes; a
sliding window (Mistral) becomes a band over those counts.

A capacity bucket keeps the number of compiled graphs small (one per batch size and bucket);
inductor's caches persist on disk between runs, while Dynamo traces the step again in each
process (the compile time the CLI reports).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from attnlab.nn.cache import StaticCache

BUCKET = 256  # capacities are multiples of this (or the model's context, when smaller)


def capacity_for(total: int, context: int | None, bucket: int = BUCKET) -> int:
    """Slots for ``total`` positions: rounded up to a multiple of ``bucket``, never past the
    model's ``context`` (which ``total`` must fit)."""
    capacity = -(-total // bucket) * bucket
    return capacity if context is None else min(capacity, context)


def one_token(model: nn.Module, token: Tensor, key_mask: Tensor, cache: StaticCache) -> Tensor:
    """Float32 next-token logits ``(batch, vocab)`` of ``token (batch, 1)``, written into
    ``cache`` at its slot. ``key_mask (batch, capacity)``: True at the slots holding real
    tokens, this one included."""
    positions = key_mask.sum(-1, keepdim=True) - 1  # (batch, 1): each row's own count
    x = model.embed_tokens(token, positions)
    mask = key_mask[:, None, None, :]
    window = model.config.sliding_window
    if window is not None:  # i − W < j ≤ i, in real tokens (left padding shifts both)
        counted = key_mask.long().cumsum(-1)
        mask = mask & (counted > positions + 1 - window)[:, None, None, :]
    h = model.blocks(x, mask=mask, positional=model.positional, positions=positions,
                     cache=cache)
    return model.lm_head(h[:, -1]).float()


class CompiledStep:
    """:func:`one_token` compiled with ``torch.compile`` (inductor's C++ backend on a CPU, Triton
    on a GPU; ``backend`` picks another, e.g. ``"eager"`` in tests), with what compiling cost:
    ``compile_seconds`` is the time of each new shape's first call (tracing, code generation
    and that step), ``compiles`` how many there were. Shapes are static: a new batch size or
    capacity compiles a new graph, a new token or position never does."""

    def __init__(self, backend: str = "inductor"):
        self.function = torch.compile(one_token, backend=backend, dynamic=False, fullgraph=True)
        self.compile_seconds = 0.0
        self.compiles = 0
        self._shapes: set[tuple] = set()

    def __call__(self, model: nn.Module, token: Tensor, key_mask: Tensor,
                 cache: StaticCache) -> Tensor:
        shape = (id(model), tuple(token.shape), cache.capacity, token.device, cache[0].k.dtype)
        if shape in self._shapes:
            return self.function(model, token, key_mask, cache)
        begun = time.perf_counter()
        logits = self.function(model, token, key_mask, cache)
        self.compile_seconds += time.perf_counter() - begun
        self.compiles += 1
        self._shapes.add(shape)
        return logits


class StaticDecoding:
    """The static-cache side of :func:`~attnlab.generation.decoder_only.generate`: made from
    the growing cache the prompt filled, then one compiled step a token."""

    def __init__(self, step: CompiledStep, cache, attention_mask: Tensor | None, length: int,
                 capacity: int):
        self.step = step
        self.cache = StaticCache.from_cache(cache, capacity)
        batch, device = cache[0].k.shape[0], cache[0].k.device
        self.slot = length  # the next slot (self.cache.slots holds it as a tensor too)
        # the token's own buffer: a slice of the output would bring its strides into the
        # graph's guards, and they change with the output's length
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        if attention_mask is None:
            self.key_mask[:, :length] = True
        else:
            self.key_mask[:, :length] = attention_mask[:, :length]

    def __call__(self, model: nn.Module, token: Tensor) -> Tensor:
        """Logits of ``token (batch, 1)``, fed at the next slot."""
        self.key_mask[:, self.slot] = True
        self.token.copy_(token)
        logits = self.step(model, self.token, self.key_mask, self.cache)
        self.cache.slots += 1  # in place: the compiled graph reads the same tensor
        self.slot += 1
        return logits


__all__ = ["BUCKET", "CompiledStep", "StaticDecoding", "capacity_for", "one_token"]
