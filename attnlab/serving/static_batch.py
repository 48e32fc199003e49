"""The engine's batch in fixed shapes, for the compiled one-token step (``serve --compile``).

The eager engine's cache grows by a column a step and changes rows as requests come and go,
so no two steps have the same shapes. A compiled step needs them fixed, so here the batch
lives in storage that only changes at rare moments:

    keys, values   (max_batch, kv_heads, capacity, d_k)   every layer (a StaticCache)
    key_mask       (max_batch, capacity)                   True at a row's real tokens
    slot                                                   the column every row writes next

Rows in flight are the first ``rows`` rows; the others are spare and their outputs ignored.
Every row ends at column ``slot − 1`` (right-aligned, as in the eager engine), so one slot
serves the batch, and each row's positions come from its own count of real tokens. The
compiled step (:func:`~attnlab.generation.compiled.one_token`) runs on the first 1, 2, 4, …
rows (the fewest that hold the rows in flight) or all ``max_batch``: a few shapes per capacity
bucket whatever the number of requests, and a step never pays for many more spare rows than
it has rows in flight.

When requests join, their prompt's keys and values (prefilled eagerly) are copied in,
right-aligned at ``slot`` (the columns move right first if a prompt is longer than ``slot``).
When the slot reaches the capacity, the batch is repacked: the columns that are padding in
every row are cut, and only if none are does the capacity grow to the next bucket (a new
graph, compiled once). A row's span never exceeds the model's context, so neither does the
capacity.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.generation.compiled import BUCKET, CompiledStep, capacity_for
from attnlab.nn.cache import SelfAttentionCache, StaticCache


def row_buckets(max_batch: int) -> list[int]:
    """The row counts the step is compiled for: the powers of two below ``max_batch``, then
    ``max_batch`` itself (``8 -> [1, 2, 4, 8]``, ``6 -> [1, 2, 4, 6]``)."""
    if max_batch < 1:
        raise ValueError(f"a batch needs at least one row, got {max_batch}")
    counts, n = [], 1
    while n < max_batch:
        counts.append(n)
        n *= 2
    return [*counts, max_batch]


class StaticBatch:
    """The rows in flight in static storage, and the compiled step that decodes them."""

    def __init__(self, model: nn.Module, max_batch: int, step: CompiledStep):
        self.model, self.max_batch, self.step = model, max_batch, step
        self.context = model.config.context
        self.cache: StaticCache | None = None
        self.key_mask: Tensor | None = None
        self.slot = 0
        self.rows = 0
        self.token: Tensor | None = None  # (max_batch, 1), the step's own input buffer
        self.repacks = 0  # how often the storage was remade (tests, logs)
        # the row bucket of the last step, None after a change to the rows or the storage: the
        # next step then checks its graph's guards, and the steps after it do not
        self._stepped: int | None = None
        self.buckets = row_buckets(max_batch)
        # a graph for each row bucket and each capacity (multiples of BUCKET up to the context)
        capacities = -(-self.context // BUCKET) if self.context else 64
        step.most_graphs = max(step.most_graphs, len(self.buckets) * capacities + 8)

    def _first(self) -> int:
        """The first column a row in flight uses (``slot`` when none)."""
        if not self.rows:
            return self.slot
        return int(self.key_mask[: self.rows].any(0).int().argmax())

    def _repack(self, span: int, capacity: int, like: SelfAttentionCache) -> None:
        """New storage of ``capacity`` columns, the rows' last ``slot − first`` columns moved
        to end at column ``span`` (padding cut, or room made on the left); ``like``: a cache
        of the model's layers, whose shapes and dtype the first storage takes."""
        kept = self.slot - self._first()
        self.repacks += 1
        layers = []
        for i, model_layer in enumerate(like):
            pair = []
            for name in ("k", "v"):
                old = getattr(model_layer if self.cache is None else self.cache[i], name)
                new = old.new_zeros(self.max_batch, old.shape[1], capacity, old.shape[3])
                if self.cache is not None:
                    new[:, :, span - kept : span] = old[:, :, self.slot - kept : self.slot]
                pair.append(new)
            layers.append(tuple(pair))
        mask = torch.zeros(self.max_batch, capacity, dtype=torch.bool,
                           device=layers[0][0].device)
        if self.key_mask is not None:
            mask[:, span - kept : span] = self.key_mask[:, self.slot - kept : self.slot]
        self.cache, self.key_mask, self.slot = StaticCache.of(layers, span), mask, span
        self._views: dict[int, StaticCache] = {}
        self._stepped = None

    def add(self, cache: SelfAttentionCache, mask: Tensor) -> None:
        """Append the rows of a prefilled ``cache`` (``mask (n, p)``: their real tokens,
        left-padded) after the rows in flight."""
        n, p = mask.shape
        if self.rows + n > self.max_batch:
            raise ValueError(f"{self.rows} + {n} rows exceed the batch of {self.max_batch}")
        span = max(self.slot - self._first(), p)
        if self.cache is None or span > self.slot or span + 1 > self.cache.capacity:
            capacity = capacity_for(span + 1, self.context)
            if self.cache is not None and span + 1 <= self.cache.capacity:
                capacity = self.cache.capacity  # room on the left is enough: no new graph
            self._repack(span, capacity, like=cache)
        rows, end = slice(self.rows, self.rows + n), self.slot
        for mine, theirs in zip(self.cache, cache, strict=True):
            mine.k[rows] = 0  # a spare row's old keys: masked now, but never NaN
            mine.v[rows] = 0
            mine.k[rows, :, end - p : end] = theirs.k[:, :, :p]
            mine.v[rows, :, end - p : end] = theirs.v[:, :, :p]
        self.key_mask[rows] = False
        self.key_mask[rows, end - p : end] = mask
        self.rows += n
        self._stepped = None
        if self.token is None:
            self.token = torch.zeros(self.max_batch, 1, dtype=torch.long, device=mask.device)

    def keep(self, index: Tensor) -> None:
        """Keep the rows ``index`` (in that order) at the top."""
        n = len(index)
        for layer in self.cache:
            layer.k[:n] = layer.k.index_select(0, index)
            layer.v[:n] = layer.v.index_select(0, index)
        self.key_mask[:n] = self.key_mask.index_select(0, index)
        self.rows = n
        self._stepped = None

    def _view(self, rows: int) -> StaticCache:
        """The first ``rows`` rows of the storage as a cache of their own (views: what the step
        writes lands in the storage), sharing its slot."""
        if rows not in self._views:
            view = StaticCache.of([(layer.k[:rows], layer.v[:rows]) for layer in self.cache],
                                  self.slot)
            view.slots = self.cache.slots
            self._views[rows] = view
        return self._views[rows]

    def __call__(self, last: Tensor) -> Tensor:
        """Float32 logits ``(rows, vocab)`` of each row's newest token ``last (rows,)``. The
        step runs on the first ``bucket`` rows, the smallest of :attr:`buckets` that holds the
        rows in flight: spare rows cost as much as real ones, so three requests run four rows
        rather than ``max_batch``. One graph per bucket and capacity, which
        :meth:`Engine.warm_up <attnlab.serving.engine.Engine.warm_up>` compiles before the
        server listens."""
        if self.slot == self.cache.capacity:  # full: cut the padding, or grow a bucket
            span = self.slot - self._first()
            self._repack(span, capacity_for(span + 1, self.context), like=self.cache)
        rows = next(n for n in self.buckets if n >= self.rows)
        self.token[: self.rows, 0] = last
        self.key_mask[:, self.slot] = True  # spare rows too: none is fully masked
        # the same rows and storage as the last step, which checked its guards: no check now
        # (what they test, the model, dtypes and strides, has not changed since)
        logits = self.step(self.model, self.token[:rows], self.key_mask[:rows],
                           self._view(rows), again=self._stepped == rows)
        self._stepped = rows
        self.cache.slots += 1  # in place: the compiled graph reads the same tensor
        self.slot += 1
        return logits[: self.rows]


__all__ = ["StaticBatch", "row_buckets"]
