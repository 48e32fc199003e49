"""Position-wise feed-forward networks (paper section 3.3), applied to each position alike.

    ReLU (the paper):  FFN(x) = W₂ · max(0, x·W₁ + b₁) + b₂
    GELU (GPT, BERT):  FFN(x) = W₂ · GELU(x·W₁ + b₁) + b₂
    SwiGLU (Llama):    FFN(x) = W₂ · (SiLU(x·W₁) ⊙ x·W₃)
    GEGLU (T5 v1.1):   FFN(x) = W₂ · (GELU_tanh(x·W₁) ⊙ x·W₃)

The gated kinds (Shazeer, 2020) differ only in the nonlinearity on the gate x·W₁.

Shapes: ``(batch, seq, d_model) -> (batch, seq, d_ff) -> (batch, seq, d_model)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import BadInput

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # the exact erf form (BERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
}
# gated activation -> the nonlinearity on its gate (T5's "gated-gelu" is gelu_new: tanh GELU)
GATES = {"swiglu": "silu", "geglu": "gelu_tanh"}


class FeedForward(nn.Module):
    """Two linear maps around a nonlinearity; a gated activation (``swiglu``, ``geglu``) adds
    a third map ``w3`` whose output the activated ``w1`` output multiplies."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        if activation not in GATES and activation not in ACTIVATIONS:
            raise BadInput(f"unknown activation {activation!r}")
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if activation in GATES else None
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)  # inside the FFN, after the nonlinearity
        self.w13: nn.Module | None = None  # w1 and w3 as one product (fuse_gate_)

    def fuse_gate_(self, w13: nn.Module) -> None:
        """A gated FFN's ``w1`` and ``w3`` replaced by ``w13``, which computes ``[x·W₁ | x·W₃]``
        in one product (decoding: :func:`attnlab.cpu.linear.fuse_projections_`)."""
        if self.w3 is None:
            raise BadInput("only a gated feed-forward (swiglu, geglu) has w1 and w3 to fuse")
        self.w1 = self.w3 = None
        self.w13 = w13

    def forward(self, x: Tensor) -> Tensor:
        if self.w13 is not None:
            gate, up = self.w13(x).chunk(2, dim=-1)
        else:
            gate, up = self.w1(x), None if self.w3 is None else self.w3(x)
        hidden = ACTIVATIONS[GATES.get(self.activation, self.activation)](gate)
        if up is not None:
            hidden = hidden * up
        return self.w2(self.dropout(hidden))
