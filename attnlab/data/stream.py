"""The protocol every training batch stream follows, for resumable and distributed training.

A stream is endless and *indexed*: batch n is a pure function of ``(seed, n)``, so the trainer
can checkpoint the stream as one integer and any rank can compute its rows of any batch. A
subclass only defines :meth:`SeededBatches.batch`.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor


class SeededBatches:
    """Iteration, sharding and state for streams defined by ``batch(n)``."""

    position: int = 0  # the number of batches handed out so far
    rank: int = 0
    world: int = 1

    def batch(self, n: int) -> tuple[Tensor, ...]:
        """The global batch number ``n``, this rank's rows of it."""
        raise NotImplementedError

    def shard(self, rank: int, world: int) -> SeededBatches:
        """From now on, give rank ``rank`` of ``world`` its rows of every batch."""
        self.rank, self.world = rank, world
        return self

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        while True:
            self.position += 1  # before yielding: a checkpoint taken now points past this batch
            yield self.batch(self.position - 1)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])
