"""Normalisation layers and where they sit around each residual sublayer.

LayerNorm (Ba et al., 2016), over the last dimension of ``(batch, seq, d_model)``:

    LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β,   μ, σ² the mean and (biased) variance of x

RMSNorm (Zhang & Sennrich, 2019) drops the centring and the bias:

    RMS(x) = γ ⊙ x / √(mean(x²) + ε)

Placement of a sublayer F (attention or feed-forward) with dropout D:

    post-LN (the paper, BERT):  x ← Norm(x + D(F(x)))
    pre-LN  (GPT-2, Llama):     x ← x + D(F(Norm(x)))

Pre-LN keeps an un-normalised residual path and trains without warmup tricks; it then needs a
final norm after the last layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import BadInput


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (its fused kernel) with an optional bias: ``(..., d) -> (..., d)``."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(d_model, eps=eps, bias=bias)


class RMSNorm(nn.Module):
    """γ ⊙ x / √(mean(x²) + ε), computed in float32 for stability: ``(..., d) -> (..., d)``."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return normed * self.weight


def build_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """``layernorm`` or ``rmsnorm``."""
    if kind == "layernorm":
        return LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=eps)
    raise BadInput(f"unknown norm {kind!r}")


class Residual(nn.Module):
    """One residual sublayer with its norm, in post-LN or pre-LN placement (see module doc)."""

    def __init__(self, norm: nn.Module, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
