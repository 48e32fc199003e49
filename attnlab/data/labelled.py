"""Batches of labelled rows, for fine-tuning an encoder on a task (:mod:`attnlab.tasks`): each
row is ``(ids, label)``, the label one class (classification) or one per position (tagging).
Rows are right-padded to the longest in their batch; training draws them in a seeded endless
stream, validation in a fixed order."""

from __future__ import annotations

import torch

from attnlab.data.stream import LabelledBatch, SeededBatches

IGNORE = -100  # the label of a position the loss skips (cross_entropy's ignore_index)


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)`` right-padded to the longest row: ``(batch, seq)`` each."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def collate(rows: list[tuple[list[int], int | list[int]]], pad_id: int) -> LabelledBatch:
    """``(ids, token_type_ids, attention_mask, labels)``, right-padded to the longest row.
    A row's label is one class ``(batch,)``, or one per position (tagging) ``(batch, seq)``,
    padded with -100, the label the loss ignores."""
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    per_position = isinstance(rows[0][1], list)
    labels = torch.full_like(ids, IGNORE) if per_position else torch.tensor([y for _, y in rows])
    for i, (r, y) in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)] = torch.tensor(r), 1
        if per_position:
            labels[i, : len(y)] = torch.tensor(y)
    return LabelledBatch(ids, torch.zeros_like(ids), attention, labels)


def fixed_batches(rows: list[tuple[list[int], int]], batch_size: int,
                  pad_id: int) -> list[LabelledBatch]:
    """Evaluation batches in a fixed order, sorted by length so little padding is computed."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    return [collate([rows[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class LabelledBatches(SeededBatches):
    """Endless shuffled training batches: epoch e is a permutation seeded by ``(seed, e)``, so
    batch n is known from n alone and a resumed run sees the same batches."""

    def __init__(self, rows: list[tuple[list[int], int]], batch_size: int, pad_id: int,
                 seed: int = 0):
        self.rows, self.batch_size, self.pad_id, self.seed = rows, batch_size, pad_id, seed
        self.per_epoch = max(1, len(rows) // batch_size)

    def batch(self, n: int) -> LabelledBatch:
        epoch, k = divmod(n, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.rows), generator=g)
        chosen = order[k * self.batch_size : (k + 1) * self.batch_size][self.rank :: self.world]
        return self.collate([self.rows[i] for i in chosen.tolist()], self.pad_id)

    @staticmethod
    def collate(rows: list, pad_id: int) -> LabelledBatch:
        """One batch of rows (a subclass batches other rows: spans for QA)."""
        return collate(rows, pad_id)
