"""Weight memory layout for decoding: the same matrices, stored the way the kernels read fastest.

    y = x · Wᵀ      x (rows, in), W (out, in)

Float32, bfloat16 and float16 layers on a CPU run attnlab's few-row kernel
(:class:`KernelLinear`, row-major ``W``); where it cannot be built, PyTorch's one-row fp32
product reads ``W`` stored input-major faster: its memory holds ``Wᵀ`` row by row, a
row-major ``(in, out)`` matrix. Shapes, values and parameter names do not change.

Matrices that read the same input are stacked into one (:func:`fuse_projections_`):
self-attention's ``[W_Q | W_K | W_V]`` and a gated feed-forward's ``[W₁ | W₃]``, for the integer
layers and for :class:`KernelLinear`. The kernels compute each output row on its own, so the
values are the same; a decoded token makes 4 products a layer instead of 7 (each call is a
dispatch from the compiled graph's Python wrapper, rounds its ``x`` or starts its threads).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.cpu import kernels as cpu_kernels


class KernelLinear(nn.Linear):
    """``nn.Linear`` whose few-row products on a CPU (decoding: one token a sequence) run
    attnlab's kernel (:mod:`attnlab.cpu.kernels`), ``y = x · Wᵀ + b`` with each row of
    ``W (out, in)`` read once for all the rows of ``x (…, in)`` (decoding is bound by the bytes
    of ``W``, so reading each row once is the point; docs/benchmarks.md has the figures).

    A bfloat16 or float16 layer runs the same kernel, ``W`` widened exactly to float32 as it is
    read and the sums in float32: with float32 ``x`` (decoding's activations,
    :func:`~attnlab.cpu.prepare.float32_activations_`) ``y`` is float32, and a prompt's GEMM
    rounds ``x`` to the dtype and widens ``y``; with ``x`` in the dtype, ``y`` is rounded once
    to it, as ``nn.Linear``'s own product does up to the order of the sums. A decoding step of
    4 to 32 sequences (or beams) through a bf16 layer, ``x (batch, 1, in)``, where the kernels
    run AVX512-BF16 (:func:`~attnlab.cpu.kernels.bf16_dot_rows`), rounds ``x`` to bf16 and
    multiplies with ``vdpbf16ps``, float32 sums: with float32 ``x`` such a batch is bound by
    widening the weights for each row. Several tokens of one sequence never do.
    Anything else (more rows, a gradient to pass, another device or dtype, a weight not
    row-major, CPU autocast) is ``nn.Linear``'s own product."""

    ROWS = 32  # beyond this, PyTorch's GEMM reuses each weight better

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if self._kernel_applies(x):
            rows = x.reshape(-1, w.shape[1]).contiguous()
            # one token of each of 4+ sequences, (batch, 1, in): vdpbf16ps; the tokens of one
            # sequence (a prompt, a verification, any 2-D x) stay on float32 x (the shape is
            # asked first: a one-sequence step never asks the kernels)
            batch = (w.dtype == torch.bfloat16 and x.dim() >= 3 and x.shape[-2] == 1
                     and rows.shape[0] >= cpu_kernels.BF16_DOT_ROWS
                     and cpu_kernels.bf16_dot_rows() is not None)
            product = (torch.ops.attnlab.bf16_batch_matmul if batch
                       else torch.ops.attnlab.float_matmul)
            return product(rows, w, self.bias).view(*x.shape[:-1], w.shape[0])
        if x.dtype == torch.float32 != w.dtype:  # float32 activations, 16-bit W: a prompt's
            return super().forward(x.to(w.dtype)).to(x.dtype)  # GEMM in W's dtype, as before
        return super().forward(x)

    def _kernel_applies(self, x: Tensor) -> bool:
        w, b = self.weight, self.bias
        on_cpu = (x.device.type == w.device.type == "cpu" and x.dtype in (w.dtype, torch.float32)
                  and w.dtype in cpu_kernels.FLOAT_DTYPES and w.is_contiguous()
                  and (b is None or b.device.type == "cpu" and b.dtype == w.dtype
                       and b.is_contiguous()))
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                            or b is not None and b.requires_grad)
        return (on_cpu and not grad and 0 < w.shape[1] == x.shape[-1]
                and x.numel() <= self.ROWS * w.shape[1]
                and not _autocast_on_cpu() and cpu_kernels.available())


def _autocast_on_cpu() -> bool:
    """Whether CPU autocast is on (``nn.Linear`` would then compute in its lower dtype)."""
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled()


@torch.no_grad()
def decoding_layout_(model: nn.Module, rows: int = 1) -> nn.Module:
    """Ready every CPU ``nn.Linear`` for decoding, in place; returns ``model``. Where attnlab's
    CPU kernels are built, each fp32, bf16 or fp16 one becomes a :class:`KernelLinear` over a
    row-major weight. Elsewhere (PyTorch's kernels), fp32 is stored input-major for ``rows`` = 1
    (the matrix-vector products), row-major for a batch of ``rows`` > 1, whose products PyTorch
    reads faster row-major (docs/benchmarks.md, "Batched decoding").

    Input-major, ``W (out, in)`` keeps its shape, values and name, but its memory holds Wᵀ
    row by row, so ``x · Wᵀ`` multiplies by a row-major ``(in, out)`` matrix, which PyTorch's
    one-row fp32 CPU kernels read faster. bf16 is the other way round, so other dtypes (and
    other devices) are made row-major again, e.g. after ``.to(torch.bfloat16)`` kept the
    strides. A tied embedding shares the change (a one-row lookup does not mind). Saving still
    works: both writers make tensors contiguous, and the state dict's names and shapes are the
    same.
    """
    for m in model.modules():
        if not isinstance(m, nn.Linear):
            continue
        w = m.weight
        fp32_cpu = w.device.type == "cpu" and w.dtype == torch.float32
        if (w.device.type == "cpu" and w.dtype in cpu_kernels.FLOAT_DTYPES and type(m) is nn.Linear
                and cpu_kernels.available()):
            m.__class__ = KernelLinear  # (the same module: its parameters, hooks, ties)
        if fp32_cpu and rows == 1 and not isinstance(m, KernelLinear):
            if w.is_contiguous():
                w.data = w.data.t().contiguous().t()
        elif not w.is_contiguous():
            w.data = w.data.contiguous()
    return model


def fuse_projections_(model: nn.Module) -> nn.Module:
    """Stack each self-attention's Q, K, V and each gated feed-forward's W₁, W₃ into one
    layer (:func:`stack_rows`: integer layers and :class:`KernelLinear`), in place; returns
    ``model``. Plain ``nn.Linear``, adapters and cross-attention stay as they are. Names change
    (``qkv``, ``w13``): a copy for decoding, not one to save."""
    from attnlab.nn.feedforward import FeedForward
    from attnlab.nn.multihead import MultiHeadAttention

    for name, m in list(model.named_modules()):
        if isinstance(m, MultiHeadAttention) and name.endswith("self_attn") and not m.fused_qkv:
            fused = stack_rows([m.q_proj, m.k_proj, m.v_proj])
            if fused is not None:
                m.fuse_qkv_(fused)
        elif isinstance(m, FeedForward) and m.w3 is not None:
            fused = stack_rows([m.w1, m.w3])
            if fused is not None:
                m.fuse_gate_(fused)
    return model


def stack_rows(layers: list[nn.Module]) -> nn.Module | None:
    """One layer whose output is ``[y₁ | y₂ | …]``, the ``layers``' outputs side by side
    (their rows stacked), or None where they are not all :class:`Int4Linear` of one group
    size and width, all float-activation :class:`Int8Linear`, or all CPU :class:`KernelLinear`
    of one dtype, over the same inputs. The kernels compute each output row on its
    own, so every value is what the layer gave alone (for ``KernelLinear``, up to its
    ``ROWS`` rows: a longer prompt runs PyTorch's GEMM, which may round a stacked matrix's
    rows differently): decoding then pays one call (and rounds ``x`` once) for Q, K and V (or
    W₁ and W₃). A plain ``nn.Linear`` is not stacked: its one-row layout is input-major
    (:func:`decoding_layout_`), whose rows cannot simply be concatenated, and PyTorch's GEMM
    gives no promise of the same values."""
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    first = layers[0]
    if not isinstance(first, (Int4Linear, Int8Linear, KernelLinear)):  # or LoRA over one
        return None
    same = all(type(m) is type(first) and m.in_features == first.in_features
               and (m.bias is None) == (first.bias is None) for m in layers)
    if not same or isinstance(first, Int8Linear) and any(m.activations != "float"
                                                         for m in layers):
        return None
    out_features = sum(m.out_features for m in layers)
    if isinstance(first, KernelLinear):
        return _stack_float(layers, out_features)
    if isinstance(first, Int4Linear):
        if any((m.group_size, m.bits) != (first.group_size, first.bits) for m in layers):
            return None
        fused = type(first)(first.in_features, out_features, first.group_size,
                            first.bias is not None, first.bits, first.qweight.device)
        names = ("qweight", "scales", "zeros", "kernel_scales", "kernel_offsets")
    elif isinstance(first, Int8Linear):
        fused = type(first)(first.in_features, out_features, first.bias is not None,
                            device=first.qweight.device)
        names = ("qweight", "scales", "kernel_scales")
    else:
        return None
    for name in names:
        setattr(fused, name, torch.cat([getattr(m, name) for m in layers]))
    if first.bias is not None:
        fused.bias.data = torch.cat([m.bias.detach() for m in layers])
    return fused


def _stack_float(layers: list[KernelLinear], out_features: int) -> KernelLinear | None:
    """:func:`stack_rows` of CPU :class:`KernelLinear` layers of one dtype the kernel reads
    (their weights and biases concatenated, row-major as the kernel reads them), or None for
    any other dtype or device."""
    first = layers[0]
    dtype = first.weight.dtype
    tensors = [t for m in layers for t in (m.weight, m.bias) if t is not None]
    if dtype not in cpu_kernels.FLOAT_DTYPES or any(
            t.dtype != dtype or t.device.type != "cpu" for t in tensors):
        return None
    fused = KernelLinear(first.in_features, out_features, bias=first.bias is not None,
                         device="meta", dtype=dtype)  # (no memory until the values arrive)
    fused.weight = nn.Parameter(torch.cat([m.weight.detach() for m in layers]),
                                requires_grad=first.weight.requires_grad)
    if first.bias is not None:
        fused.bias = nn.Parameter(torch.cat([m.bias.detach() for m in layers]),
                                  requires_grad=first.bias.requires_grad)
    return fused.train(first.training)
