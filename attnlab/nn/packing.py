"""Packing: a padded batch's real tokens side by side, so that the position-wise parts of a
layer (the Q/K/V and output projections, the feed-forward, the norms) compute nothing for
padding.

    padded   x (batch, seq, f), mask (batch, seq): True at real tokens
    packed   x[mask] (n_real, f)                    n_real = mask.sum()

Only attention mixes positions: it unpacks its queries, keys and values to the padded layout
(zeros at padding, masked as keys), runs the fused kernel, and packs its output again. On
batches of sentences of mixed lengths most of the padded layout can be padding (CoNLL-2003
sentences in random batches of 32: about 60%), and the matrix products, which dominate a
training step, shrink by that much. The outputs at real positions are those of the padded
computation; at padded positions the unpacked output holds zeros.
"""

from __future__ import annotations

from torch import Tensor


class Packing:
    """The real positions of a ``(batch, seq)`` boolean mask; see the module docstring."""

    def __init__(self, mask: Tensor):
        self.batch, self.seq = mask.shape
        self.index = mask.reshape(-1).nonzero().squeeze(1)  # (n_real,) flat positions

    @classmethod
    def of(cls, mask: Tensor | None) -> Packing | None:
        """A packing when ``mask (batch, seq)`` holds padding, else None (nothing to gain)."""
        if mask is None or mask.dim() != 2 or bool(mask.all()):
            return None
        return cls(mask.bool())

    def pack(self, x: Tensor) -> Tensor:
        """``(batch, seq, f)`` -> ``(n_real, f)``."""
        return x.reshape(self.batch * self.seq, -1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """``(n_real, f)`` -> ``(batch, seq, f)``, zeros at padding."""
        out = x.new_zeros(self.batch * self.seq, x.shape[-1])
        return out.index_copy(0, self.index, x).view(self.batch, self.seq, -1)
