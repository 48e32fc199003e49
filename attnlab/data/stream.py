"""What a training batch is, and the protocol every batch stream follows, for resumable and
distributed training.

A batch is a small named tuple of tensors, one type per task, read by name (``batch.tgt``),
never by position:

* :class:`TranslationBatch` ``(src, tgt)``: padded source ids; target ids ``bos … eos``;
* :class:`LMBatch` ``(inputs, targets)``: a window of text and the same window shifted by one;
* :class:`MaskedLMBatch` ``(ids, token_type_ids, attention_mask, labels, nsp)``: labels are
  -100 except at the selected positions; ``nsp`` is 0 when B follows A, 1 when not;
* :class:`LabelledBatch` ``(ids, token_type_ids, attention_mask, labels)``: one label a row;
* :class:`ImageBatch` ``(images, labels)``: images ``(batch, channels, height, width)`` in
  [0, 1], one label an image.

A stream is endless and *indexed*: batch n is a pure function of ``(seed, n)``, so the trainer
can checkpoint the stream as one integer and any rank can compute its rows of any batch. A
subclass only defines :meth:`SeededBatches.batch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor


class TranslationBatch(NamedTuple):
    src: Tensor  # (batch, src_len)
    tgt: Tensor  # (batch, tgt_len), bos ... eos


class LMBatch(NamedTuple):
    inputs: Tensor  # (batch, block)
    targets: Tensor  # (batch, block): inputs shifted left by one token


class MaskedLMBatch(NamedTuple):
    ids: Tensor  # (batch, seq), with the selected positions masked
    token_type_ids: Tensor  # (batch, seq)
    attention_mask: Tensor  # (batch, seq), 1 at real tokens
    labels: Tensor  # (batch, seq): the original id at selected positions, else -100
    nsp: Tensor  # (batch,)


class LabelledBatch(NamedTuple):
    ids: Tensor  # (batch, seq)
    token_type_ids: Tensor  # (batch, seq)
    attention_mask: Tensor  # (batch, seq), 1 at real tokens
    labels: Tensor  # (batch,) a class; (batch, seq) a tag (NER); (batch, 2) a span (QA)


class ImageBatch(NamedTuple):
    images: Tensor  # (batch, channels, height, width), values in [0, 1]
    labels: Tensor  # (batch,)


def to_device(batch: tuple, device: torch.device | str) -> tuple:
    """The same batch (same named type) with every tensor on ``device``."""
    moved = [t.to(device, non_blocking=True) for t in batch]
    return batch._make(moved) if hasattr(batch, "_make") else tuple(moved)


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
