"""Low-rank adaptation (LoRA; Hu et al., 2021): a frozen linear map plus a trained update of
rank r.

    h = W x + b + (α / r) · B A Dropout(x)      W (out, in) frozen; A (r, in), B (out, r)

A starts random (Kaiming-uniform, as ``nn.Linear`` and peft draw it) and B at zero, so before
training ``B A = 0`` and the model is exactly the one it adapts. Only A and B train: r·(in +
out) numbers per matrix instead of in·out. After training, :meth:`LoRALinear.merge` folds the
update into the weight, ``W ← W + (α/r)·B A``, and the layer costs what the plain linear
costs; :meth:`LoRALinear.unmerge` subtracts it again.

Shapes: ``x (..., in) -> (..., out)``. The base is any module mapping ``in -> out`` with
``in_features``/``out_features`` (``nn.Linear``, or the 4-bit linears of
:mod:`attnlab.nn.quantized`: QLoRA trains A and B over frozen 4-bit codes; such a base cannot
be merged into).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) · B(A(Dropout(x)))``; see the module docstring.

    Args:
        base: the frozen map (its parameters are set to ``requires_grad=False``).
        r: the rank of the update.
        alpha: the update's scale numerator (peft's ``lora_alpha``); the scale is α / r.
        dropout: dropout on the LoRA path's input only (the base sees ``x`` as is).
    """

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        self.base = base
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        device = device_of(base)
        self.lora_A = nn.Linear(base.in_features, r, bias=False, device=device)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, device=device)
        if device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        self._original: Tensor | None = None  # the weight before merge()
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta(self) -> Tensor:
        """The update ``(α/r)·B A``, shaped as the base weight ``(out, in)``."""
        return self.scale * (self.lora_B.weight @ self.lora_A.weight)

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        if self.merged:
            return out
        update = self.lora_B(self.lora_A(self.dropout(x).to(self.lora_A.weight.dtype)))
        return out + (self.scale * update).to(out.dtype)

    @torch.no_grad()
    def merge(self) -> None:
        """``W ← W + (α/r)·B A``; the LoRA path is then skipped. The weight as it was is kept
        aside, so :meth:`unmerge` restores it bit for bit (subtracting the update again would
        leave float rounding behind)."""
        if not self.merged:
            weight = _float_weight(self.base)
            self._original = weight.clone()
            weight += self.delta().to(weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """The base weight exactly as it was before :meth:`merge`; the LoRA path runs again."""
        if self.merged:
            _float_weight(self.base).copy_(self._original)
            self._original = None
            self.merged = False

    @torch.no_grad()
    def folded(self) -> nn.Module:
        """The base with the update folded in for good (``merge`` without keeping the old
        weight): a plain module again, for inference."""
        weight = _float_weight(self.base)
        if not self.merged:
            weight += self.delta().to(weight.dtype)
        for p in self.base.parameters():
            p.requires_grad_(True)
        return self.base


def device_of(module: nn.Module) -> torch.device:
    """Where a module's tensors live: its first parameter's device, or its first buffer's."""
    tensor = next(iter(module.parameters()), None)
    if tensor is None:
        tensor = next(iter(module.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def mergeable(base: nn.Module) -> bool:
    """Whether ``base`` holds its weight as a float parameter that an update can be added
    to. An integer layer's ``weight`` is a dequantised copy made on each read: an update
    added there would be lost, so a quantised base keeps its LoRA path apart."""
    weight = getattr(base, "weight", None)
    return isinstance(weight, nn.Parameter) and weight.is_floating_point()


def _float_weight(base: nn.Module) -> Tensor:
    if not mergeable(base):
        raise ValueError(f"{type(base).__name__} holds no float weight to merge LoRA into "
                         "(a quantised base keeps its update apart)")
    return base.weight
