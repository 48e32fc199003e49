"""4-bit weight-only linear layers: decoding reads 4.5 bits per weight instead of 32.

Generating one token reads every weight matrix once, so on a CPU a small model's decoding
speed is set by how many bytes the weights take. A group-wise 4-bit code stores each row of
``W (out, in)`` in groups of ``g`` consecutive inputs, with a scale ``s`` and a minimum ``m``
per group (llama.cpp's Q4_1 with g = 32):

    W[o, i] = s[o, i // g] · c[o, i] + m[o, i // g],     c ∈ {0, …, 15}

and ``y = x · Wᵀ`` runs in PyTorch's int4 CPU kernel, which unpacks each group on the fly. The
kernel takes bfloat16 activations (it is slow in float32), so the scales and minima are stored
in bfloat16 and the layer computes in bfloat16 whatever its input: a 4-bit model runs with
bf16 activations. The packed kernel is PyTorch's CPU one, so the layer runs on the CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput

_COMPUTE = torch.bfloat16


def fits_int4(in_features: int, out_features: int, group_size: int = 32) -> bool:
    return in_features % group_size == 0 and out_features % 16 == 0


class Int4Linear(nn.Module):
    """``y = x · Wᵀ (+ b)`` with ``W`` held as group-wise 4-bit codes (module docstring).

    Shapes: ``x (..., in_features) -> (..., out_features)``. Build one with
    :meth:`from_codes` (codes taken as they are, e.g. from a GGUF file) or :meth:`from_linear`
    (quantise a float layer).
    """

    def __init__(self, in_features: int, out_features: int, group_size: int = 32,
                 bias: bool = False):
        super().__init__()
        if not fits_int4(in_features, out_features, group_size):
            raise BadInput(f"Int4Linear({in_features} -> {out_features}): in_features must be "
                           f"a multiple of group_size={group_size} and out_features of 16 "
                           "(the packed kernel's tiles)")
        self.in_features, self.out_features = in_features, out_features
        self.group_size = group_size
        self.register_buffer("codes", torch.zeros(out_features, in_features // 2,
                                                  dtype=torch.uint8))
        # (in / g, out, 2): [scale, zero] as the kernel wants them, zero = m + 8·s because the
        # kernel reads the codes as signed, c − 8.
        self.register_buffer("scale_and_zero", torch.zeros(
            in_features // group_size, out_features, 2, dtype=_COMPUTE))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=_COMPUTE)) if bias else None

    @classmethod
    def from_codes(cls, codes: Tensor, scale: Tensor, minimum: Tensor,
                   bias: Tensor | None = None) -> Int4Linear:
        """``codes (out, in)`` in 0..15, ``scale`` and ``minimum (out, in / g)``."""
        out_features, in_features = codes.shape
        group_size = in_features // scale.shape[1]
        layer = cls(in_features, out_features, group_size, bias=bias is not None)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        layer.codes = packed
        zero = minimum.float() + 8 * scale.float()
        layer.scale_and_zero = torch.stack([scale.float(), zero], -1).transpose(0, 1).to(
            _COMPUTE).contiguous()
        if bias is not None:
            layer.bias.data = bias.to(_COMPUTE)
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32) -> Int4Linear:
        """Quantise a float layer, each group mapped onto 16 levels from its min to its max."""
        w = linear.weight.detach().float()
        out_features, in_features = w.shape
        groups = w.view(out_features, in_features // group_size, group_size)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_codes(codes.view(out_features, in_features), scale, low, bias)

    @property
    def weight(self) -> Tensor:
        """The dequantised ``W (out, in)`` in bfloat16 (what the kernel multiplies by)."""
        eye = torch.eye(self.in_features, dtype=_COMPUTE, device=self.codes.device)
        return self._int4_matmul(eye).t()

    def _int4_matmul(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.codes, self.group_size,
                                                          self.scale_and_zero)

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu":
            raise RuntimeError(f"Int4Linear runs on the CPU (its packed int4 kernel is PyTorch's "
                               f"CPU one); got an input on {x.device}")
        shape = x.shape
        y = self._int4_matmul(x.reshape(-1, self.in_features).to(_COMPUTE).contiguous())
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}")


def quantize_int4(model: nn.Module, group_size: int = 32, skip: tuple[str, ...] = ("lm_head",)
                  ) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (except names ending in ``skip``, and layers
    whose shape the kernel cannot tile) by an :class:`Int4Linear` and cast the rest to
    bfloat16, in place; returns ``model``."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if (isinstance(child, nn.Linear) and not full.endswith(skip)
                    and fits_int4(child.in_features, child.out_features, group_size)):
                setattr(module, child_name, Int4Linear.from_linear(child, group_size))
    return model.to(_COMPUTE)


__all__ = ["Int4Linear", "fits_int4", "quantize_int4"]
