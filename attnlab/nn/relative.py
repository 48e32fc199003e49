"""T5's relative position bias (Raffel et al., 2020, section 2.1).

No position enters the embeddings. Instead every attention score gets a learned scalar that
depends only on the offset between key and query, one per head:

    score(i, j) = q_i · k_j + b_h[bucket(j − i)]             b: (num_buckets, heads)

Offsets are grouped into buckets, exact for small offsets and logarithmically coarser for
large ones, so one table covers any length (T5 extrapolates). For a distance d ≥ 0 and n
buckets on its side, half of them (``e = n // 2``) hold the distances 0 … e − 1 exactly and the
rest are log-spaced up to ``max_distance``, beyond which every distance shares the last bucket:

    bucket(d) = d                                                    d < e
              = min(n − 1, e + ⌊log(d / e) / log(max_distance / e) · (n − e)⌋)   d ≥ e

* **bidirectional** (the encoder): n = num_buckets / 2 per direction; keys before or at the
  query (j ≤ i) use d = i − j and buckets 0 … n − 1, keys after it (j > i) use d = j − i and
  buckets n … 2n − 1.
* **causal** (the decoder): keys after the query are masked anyway, so all num_buckets go to
  d = max(i − j, 0).

With T5's 32 buckets and max_distance 128 the encoder has 16 a side: distances 0 … 7 exact,
8 … 127 in 8 log-spaced buckets, 128 and beyond in bucket 15 (31 after the query).

The table is one per stack (the encoder's and the decoder's differ) and the bias is computed
once per forward pass and added in every layer; Hugging Face keeps the table in layer 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.nn.positional import PositionalEncoding, trailing_keys


def relative_position_bucket(relative: Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """The bucket (a long tensor of ``relative``'s shape) of each offset ``relative = j − i``
    (key position minus query position); the formula is in the module docstring."""
    if bidirectional:
        num_buckets //= 2
        offset = torch.where(relative > 0, num_buckets, 0)  # keys after the query: upper half
        distance = relative.abs()
    else:
        offset = torch.zeros_like(relative)
        distance = (-relative).clamp(min=0)  # a later key (masked anyway) counts as distance 0
    exact = num_buckets // 2
    # Only distances >= exact take the log branch; clamping keeps log(0) = -inf out of it.
    far = distance.clamp(min=exact).float()
    log_bucket = exact + (torch.log(far / exact) / math.log(max_distance / exact)
                          * (num_buckets - exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)  # max_distance and beyond: the last
    return offset + torch.where(distance < exact, distance, log_bucket)


class RelativePositionBias(PositionalEncoding):
    """A learned score bias per head and bucket of ``j − i``: ``attention_bias`` returns
    ``b[bucket(j − i)]`` as ``(1, heads, q_len, k_len)`` (``(batch, ...)`` for per-row
    positions). ``bidirectional``: the encoder's buckets; otherwise the decoder's (causal)."""

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def attention_bias(self, q_pos: Tensor, k_len: int, k_pos: Tensor | None = None) -> Tensor:
        # by default the k_len keys end at the last query (a cached decoder: cached + new)
        k_pos = trailing_keys(q_pos, k_len) if k_pos is None else k_pos
        relative = k_pos[..., None, :] - q_pos[..., :, None]  # ([batch,] q_len, k_len)
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets,
                                           self.max_distance)
        bias = self.embedding(buckets).movedim(-1, -3)  # ([batch,] heads, q_len, k_len)
        return bias if bias.dim() == 4 else bias[None]

    def extra_repr(self) -> str:
        kind = "bidirectional" if self.bidirectional else "causal"
        return f"{kind}, buckets={self.num_buckets}, max_distance={self.max_distance}"


__all__ = ["RelativePositionBias", "relative_position_bucket"]
