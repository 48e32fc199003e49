"""Language-model data: random windows of a token stream, resumable and shardable.

Each step draws ``batch_size`` windows of ``block + 1`` tokens at random offsets; ``x`` is the
first ``block`` tokens and ``y`` the same window shifted by one, so ``model(x)[t]`` predicts
``y[t] = x[t + 1]``. The draw for step n depends only on ``(seed, n)``, so a resumed run (or
any rank of a distributed one) sees exactly the batches it would have seen.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.data.stream import LMBatch, SeededBatches
from attnlab.errors import BadInput


class LMBatches(SeededBatches):
    """Endless ``(x, y)`` batches ``(batch_size, block)`` from ``ids`` ``(n_tokens,)``."""

    def __init__(self, ids: Tensor, block: int, batch_size: int, seed: int = 0):
        if block < 1 or batch_size < 1:
            raise BadInput(f"block and batch size must be >= 1, got block={block}, "
                           f"batch size={batch_size}")
        if ids.numel() <= block + 1:
            raise BadInput(f"text of {ids.numel()} tokens is too short for windows of "
                           f"{block + 1} tokens")
        self.ids, self.block, self.batch_size, self.seed = ids, block, batch_size, seed

    def batch(self, n: int) -> LMBatch:
        """The global batch number ``n``, this rank's rows of it."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + n)
        starts = torch.randint(0, self.ids.numel() - self.block - 1, (self.batch_size,),
                               generator=g)[self.rank :: self.world]
        windows = torch.stack([self.ids[s : s + self.block + 1] for s in starts.tolist()])
        return LMBatch(windows[:, :-1], windows[:, 1:])


def eval_windows(ids: Tensor, block: int, batch_size: int,
                 max_batches: int | None = None) -> list[LMBatch]:
    """Consecutive non-overlapping windows covering ``ids`` (a fixed validation set)."""
    n = (ids.numel() - 1) // block
    x = ids[: n * block].view(n, block)
    y = ids[1 : n * block + 1].view(n, block)
    batches = [LMBatch(x[i : i + batch_size], y[i : i + batch_size])
               for i in range(0, n, batch_size)]
    return batches[:max_batches] if max_batches else batches
