"""The integer layers on attnlab's kernels: the same codes as :mod:`attnlab.nn.quantized`, their
few-row product (decoding: a token a sequence) computed by ``int8_matmul`` and ``int4_matmul``
(:mod:`attnlab.cpu.kernels` states both algorithms and the int4 kernel's error bound).

    y = x · Ŵᵀ      x (rows, in) float32,   Ŵ the dequantised codes (out, in)

:class:`~attnlab.nn.quantized.Int8Linear` and :class:`~attnlab.nn.quantized.Int4Linear` keep
the reference product (PyTorch's int8 and int4 kernels, bf16 activations) and QLoRA's gradient
path; :func:`integer_kernels_` changes a finished model's layers into the subclasses below, which
keep every parameter, buffer and name and only read ``x`` in float32 through attnlab's kernel.
Many rows (a prompt) still run the float GEMM on ``Ŵ``, and where the kernels cannot be built
the subclasses are the reference layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.cpu import kernels
from attnlab.nn.quantized import Int4Linear, Int8Linear


class KernelInt8Linear(Int8Linear):
    """:class:`~attnlab.nn.quantized.Int8Linear` whose few rows run ``int8_matmul``:
    ``y[m, n] = s[n] · Σ_k q[n, k] x[m, k]`` with ``x`` in float32."""

    def _few_rows(self, x: Tensor) -> Tensor:
        if not kernels.available():
            return super()._few_rows(x)
        return torch.ops.attnlab.int8_matmul(x.float().contiguous(), self.qweight,
                                             self.scales[:, None], self.in_features)


class KernelInt4Linear(Int4Linear):
    """:class:`~attnlab.nn.quantized.Int4Linear` whose few rows run ``int4_matmul``:
    ``Ŵ[n, k] = s[n, g] · c[n, k] + b[n, g]`` met by ``x`` rounded to 16 bits per 32 inputs, in
    exact integer sums (groups of 32 inputs or a multiple of it)."""

    def _few_rows(self, x: Tensor) -> Tensor:
        if not kernels.available() or self.group_size % 32:
            return super()._few_rows(x)
        return torch.ops.attnlab.int4_matmul(x.float().contiguous(), self.qweight,
                                             self.kernel_scales, self.kernel_offsets,
                                             self.group_size)


_KERNEL_CLASS = {Int8Linear: KernelInt8Linear, Int4Linear: KernelInt4Linear}


def integer_kernels_(model: nn.Module) -> nn.Module:
    """Every CPU :class:`Int8Linear` and :class:`Int4Linear` of ``model`` onto attnlab's
    kernels, in place (the same modules: parameters, buffers, hooks and names are kept);
    returns ``model``. The kernels are built (or found wanting) now, never inside a compiled
    graph; a model elsewhere (a GPU, the meta device) is left as it is and builds nothing."""
    layers = [m for m in model.modules()
              if type(m) in _KERNEL_CLASS and m.qweight.device.type == "cpu"]
    if layers:
        kernels.available()
    for m in layers:
        m.__class__ = _KERNEL_CLASS[type(m)]
    return model


__all__ = ["KernelInt4Linear", "KernelInt8Linear", "integer_kernels_"]
