"""Batching by token count over length buckets, with deterministic, resumable order.

The paper batched "by approximate sequence length", about 25,000 source and 25,000 target
tokens per batch. Sorting examples by length and cutting the sorted list into batches whose
padded size ``n · max_len`` stays within ``max_tokens`` wastes little compute on padding;
shuffling the *order of batches* (seeded by ``seed + epoch``) keeps training stochastic.

The iterator's position (epoch, batch index) is plain data: ``state_dict`` / ``load_state_dict``
make a resumed run see exactly the batches the interrupted run would have seen.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from attnlab.data.stream import TranslationBatch
from attnlab.tokenizers import pad


def make_batches(lengths: list[int], max_tokens: int, max_sentences: int | None = None,
                 seed: int = 0) -> list[list[int]]:
    """Index lists whose padded size ``len(batch) · max(length)`` is at most ``max_tokens``.

    Ties in length are broken by a seeded shuffle so equal-length examples mix across batches.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: shuffled within each length
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        too_many = max_sentences is not None and len(current) >= max_sentences
        if current and (longest_if_added * (len(current) + 1) > max_tokens or too_many):
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches


class TranslationBatches:
    """Endless, resumable stream of ``(src, tgt)`` padded batches.

    ``src`` and ``tgt`` are id lists; targets should carry bos ... eos. Each batch is the
    global batch; :meth:`shard` gives rank ``r`` of ``world`` its slice of every batch.
    """

    def __init__(self, src: list[list[int]], tgt: list[list[int]], max_tokens: int,
                 seed: int = 0, pad_id: int = 0, shuffle: bool = True):
        self.src, self.tgt, self.pad_id = src, tgt, pad_id
        lengths = [max(len(s), len(t)) for s, t in zip(src, tgt, strict=True)]
        self.batches = make_batches(lengths, max_tokens, seed=seed)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0
        self.rank, self.world = 0, 1

    def shard(self, rank: int, world: int) -> TranslationBatches:
        self.rank, self.world = rank, world
        return self

    def _order(self) -> list[int]:
        order = list(range(len(self.batches)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator[TranslationBatch]:
        while True:
            order = self._order()
            while self.position < len(order):
                batch = self.batches[order[self.position]]
                self.position += 1
                yield self._padded(batch[self.rank :: self.world] or batch[:1])
            self.epoch, self.position = self.epoch + 1, 0

    def _padded(self, indices: list[int]) -> TranslationBatch:
        return TranslationBatch(pad([self.src[i] for i in indices], self.pad_id),
                                pad([self.tgt[i] for i in indices], self.pad_id))

    def one_pass(self) -> list[TranslationBatch]:
        """Every batch once, in a fixed order, unsharded: a validation set's batches."""
        return [self._padded(batch) for batch in self.batches]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
