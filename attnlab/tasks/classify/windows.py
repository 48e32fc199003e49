"""Documents longer than the input, classified through overlapping windows.

A document's tokens ``t_0 … t_{n-1}`` are cut into windows of ``room = max_len − 2`` tokens
(the 2: [CLS] and [SEP], or RoBERTa's <s> and </s>), each framed as a single text;
consecutive windows share ``stride`` tokens:

    window k = [CLS] t_{k·step} … t_{k·step + room − 1} [SEP]      step = room − stride

from k = 0 until a window reaches the last token (transformers' tokenizers with
``return_overflowing_tokens=True, stride=stride`` cut them alike). A text that fits is one
window, the same ids as without windows.

The document's logits are its windows' logits ``z_1 … z_K`` (each ``(num_labels,)``), pooled
class by class:

    max:   z_c = max_k z_{k,c}         a class is as likely as its strongest window says
    mean:  z_c = (1/K) Σ_k z_{k,c}

Pooling the logits (not the [CLS] features) keeps the model as it is: a window is an ordinary
input to the classifier, and training sends the document's loss back through every window.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.data.labelled import LabelledBatches, padded
from attnlab.errors import BadInput
from attnlab.tasks.classify.data import label_index

POOLS = ("max", "mean")


def default_stride(max_len: int) -> int:
    """A quarter of a window's room: each token but the first quarter's is read twice at most."""
    return max(0, (max_len - 2) // 4)


def check_windows(max_len: int, stride: int) -> None:
    """Windows that always move on: a stride from 0 to below half a window's room."""
    if max_len < 4:
        raise BadInput(f"--max-len {max_len}: a window needs at least 4 tokens")
    if not 0 <= stride < (max_len - 2) // 2:
        raise BadInput(f"--stride {stride} must be at least 0 and below half of a window's "
                       f"{max_len - 2} text tokens (--max-len {max_len})")


def text_windows(tokenizer, text: str, max_len: int, stride: int) -> list[list[int]]:
    """The ids of each window of ``text`` (module docstring), first to last."""
    backend = tokenizer.backend
    backend.enable_truncation(max_len, stride=stride)
    try:
        first = backend.encode(text)
    finally:
        backend.no_truncation()
    return [enc.ids for enc in [first, *first.overflowing]]


def encode_windows(examples, tokenizer, labels: list[str] | None, max_len: int,
                   stride: int) -> list[tuple[list[list[int]], int]]:
    """``(windows, label index)`` of each example (label 0 without ``labels``)."""
    return [(text_windows(tokenizer, e.text, max_len, stride),
             label_index(e, labels) if labels is not None else 0) for e in examples]


class WindowBatch(NamedTuple):
    """Documents as the rows of their windows, one document after another."""

    ids: Tensor  # (windows, seq)
    token_type_ids: Tensor  # (windows, seq), zeros
    attention_mask: Tensor  # (windows, seq), 1 at real tokens
    labels: Tensor  # (documents,)
    windows: Tensor  # (documents,): how many rows each document has


def collate_windows(rows: list[tuple[list[list[int]], int]], pad_id: int) -> WindowBatch:
    ids, mask = padded([w for windows, _ in rows for w in windows], pad_id)
    return WindowBatch(ids, torch.zeros_like(ids), mask, torch.tensor([y for _, y in rows]),
                       torch.tensor([len(windows) for windows, _ in rows]))


def fixed_window_batches(rows, batch_size: int, pad_id: int) -> list[WindowBatch]:
    """Evaluation batches of ``batch_size`` documents in a fixed order, by length."""
    order = sorted(range(len(rows)), key=lambda i: sum(map(len, rows[i][0])))
    return [collate_windows([rows[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class WindowStream(LabelledBatches):
    """Endless shuffled training batches of documents, as :class:`LabelledBatches` draws
    them; a batch holds every window of its documents."""

    @staticmethod
    def collate(rows: list, pad_id: int) -> WindowBatch:
        return collate_windows(rows, pad_id)


def pool_logits(logits: Tensor, windows: Tensor, pool: str) -> Tensor:
    """``(windows, num_labels)`` -> ``(documents, num_labels)``: each document's consecutive
    rows pooled (``max`` or ``mean``, module docstring)."""
    if pool not in POOLS:
        raise BadInput(f"pool {pool!r} is not one of {', '.join(POOLS)}")
    parts = logits.split(windows.tolist())
    return torch.stack([p.amax(0) if pool == "max" else p.mean(0) for p in parts])


__all__ = ["POOLS", "default_stride", "check_windows", "text_windows", "encode_windows",
           "WindowBatch", "collate_windows", "fixed_window_batches", "WindowStream",
           "pool_logits"]
