"""Boolean attention masks: ``True`` = this query may attend to this key.

All helpers return tensors that broadcast to ``(batch, heads, q_len, k_len)``, the shape that
:func:`attnlab.nn.scaled_dot_product_attention` expects. Conversion to whatever a kernel wants
happens only at that boundary.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: ``ids (batch, k_len)`` -> ``(batch, 1, 1, k_len)``."""
    return (ids != pad_id)[:, None, None, :]


def lengths_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Keys before each sequence's length: ``lengths (batch,)`` -> ``(batch, 1, 1, max_len)``."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]


def causal_mask(
    q_len: int, k_len: int | None = None, device: torch.device | str | None = None
) -> Tensor:
    """Query ``i`` may attend key ``j`` iff ``j <= i + (k_len - q_len)``: ``(1, 1, q_len, k_len)``.

    With ``k_len > q_len`` the queries are the *last* ``q_len`` positions (incremental decoding
    after ``k_len - q_len`` cached positions).
    """
    k_len = q_len if k_len is None else k_len
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return ones.tril(k_len - q_len)[None, None]


def sliding_window_mask(q_index: Tensor, k_index: Tensor, window: int) -> Tensor:
    """Mistral's band: query at index i may attend key j iff ``i − window < j ≤ i`` (itself
    and the ``window − 1`` before it). ``q_index (q_len,)`` and ``k_index (k_len,)`` (the keys
    may come in any order: a rolling cache's slots) -> ``(1, 1, q_len, k_len)``; or per row,
    ``(batch, q_len)`` and ``(batch, k_len)`` -> ``(batch, 1, q_len, k_len)``."""
    distance = q_index[..., :, None] - k_index[..., None, :]
    band = (distance >= 0) & (distance < window)
    return band[None, None] if band.dim() == 2 else band[:, None]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the given masks (``None`` = no constraint); broadcasting applies."""
    result = None
    for m in masks:
        if m is not None:
            result = m if result is None else result & m
    return result
