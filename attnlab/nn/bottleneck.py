"""Bottleneck adapters (Houlsby et al., 2019): a small residual MLP after a sublayer's output
projection, trained while the model stays frozen.

    y = W x + b                                   the frozen projection (attention's W_O, FFN's W₂)
    y ← y + W_up · act(W_down · y + b_down) + b_up   W_down (m, d), W_up (d, m); m ≪ d (64)

Placed after attention's output projection and after the feed-forward's second matrix, before
the residual sum, as Houlsby et al. place them. ``W_up`` and ``b_up`` start at zero, so the
adapter starts as the identity and the model is exactly the one it adapts; ``W_down`` starts
N(0, 0.01²). Each adapter adds 2·m·d + m + d parameters. Unlike LoRA it cannot be folded into
the weights (the activation is in the way): it runs at inference too.

Shapes: ``x (..., in) -> (..., out)``; the adapter acts on the ``out`` side.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.feedforward import ACTIVATIONS
from attnlab.nn.lora import device_of


class BottleneckAdapter(nn.Module):
    """``y = base(x); y + W_up·act(W_down·y)``; see the module docstring.

    Args:
        base: the frozen projection (its parameters are set to ``requires_grad=False``).
        size: the bottleneck width m.
        activation: a name in :data:`attnlab.nn.feedforward.ACTIVATIONS`.
    """

    def __init__(self, base: nn.Module, size: int, activation: str = "relu"):
        super().__init__()
        self.base = base
        self.size, self.activation = size, activation
        self.act = ACTIVATIONS[activation]
        device = device_of(base)  # an int4 base without a bias has buffers, no parameters
        d = base.out_features
        self.adapter_down = nn.Linear(d, size, device=device)
        self.adapter_up = nn.Linear(size, d, device=device)
        if device.type != "meta":
            nn.init.normal_(self.adapter_down.weight, std=0.01)
            nn.init.zeros_(self.adapter_down.bias)
            nn.init.zeros_(self.adapter_up.weight)
            nn.init.zeros_(self.adapter_up.bias)
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        h = y.to(self.adapter_down.weight.dtype)
        return y + self.adapter_up(self.act(self.adapter_down(h))).to(y.dtype)
