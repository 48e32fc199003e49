"""Weight memory layout for decoding: the same matrices, stored the way the kernels read fastest.

    y = x · Wᵀ      x (rows, in), W (out, in)

Stored input-major, ``W``'s memory holds ``Wᵀ`` row by row, so the product multiplies by a
row-major ``(in, out)`` matrix. Shapes, values and parameter names do not change.

Integer matrices that read the same input are stacked into one (:func:`fuse_projections_`):
self-attention's ``[W_Q | W_K | W_V]`` and a gated feed-forward's ``[W₁ | W₃]``. The values are
the same; a decoded token makes 4 integer products a layer instead of 7 (each call rounds its
``x`` and starts its threads).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def decoding_layout_(model: nn.Module, rows: int = 1) -> nn.Module:
    """Store every fp32 CPU ``nn.Linear`` weight input-major, in place; returns ``model``.
    ``rows``: the sequences decoded together; input-major only for one (the matrix-vector
    products), row-major for a batch, whose products PyTorch's kernels read faster row-major
    (SmolLM2 fp32, 8 rows on a 2-core AVX2 EPYC: 80.2 tokens/s row-major, 63.1 input-major;
    docs/benchmarks.md, "Batched decoding").

    ``W (out, in)`` keeps its shape, values and name, but its memory holds Wᵀ row by row, so
    ``x · Wᵀ`` multiplies by a row-major ``(in, out)`` matrix. For the one-row products of
    decoding, PyTorch's fp32 CPU kernels read that layout faster (GPT-2 124M batch 1: 37 vs
    29 tokens/s; docs/benchmarks.md). bf16 is the other way round, so other dtypes (and other
    devices) are made row-major again, e.g. after ``.to(torch.bfloat16)`` kept the strides.
    A tied embedding shares the change (a one-row lookup does not mind). Saving still works:
    both writers make tensors contiguous.
    """
    for m in model.modules():
        if not isinstance(m, nn.Linear):
            continue
        w = m.weight
        if rows == 1 and w.device.type == "cpu" and w.dtype == torch.float32:
            if w.is_contiguous():
                w.data = w.data.t().contiguous().t()
        elif not w.is_contiguous():
            w.data = w.data.contiguous()
    return model


def fuse_projections_(model: nn.Module) -> nn.Module:
    """Stack each self-attention's Q, K, V and each gated feed-forward's W₁, W₃ into one
    integer layer (:func:`stack_rows`), in place; returns ``model``.
    Float layers, adapters and cross-attention stay as they are. Names change (``qkv``,
    ``w13``): a copy for decoding, not one to save."""
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
    """One integer layer whose output is ``[y₁ | y₂ | …]``, the ``layers``' outputs side by
    side (their rows stacked), or None where they are not all :class:`Int4Linear` of one group
    size and width, or all float-activation :class:`Int8Linear`, over the same inputs. The
    kernels compute each output row on its own, so every value is what the layer gave alone:
    decoding then rounds ``x`` once, and pays one call, for Q, K and V (or W₁ and W₃)."""
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    first = layers[0]
    if not isinstance(first, (Int4Linear, Int8Linear)):  # a float layer, or LoRA over one
        return None
    same = all(type(m) is type(first) and m.in_features == first.in_features
               and (m.bias is None) == (first.bias is None) for m in layers)
    if not same or isinstance(first, Int8Linear) and any(m.activations != "float"
                                                         for m in layers):
        return None
    out_features = sum(m.out_features for m in layers)
    if isinstance(first, Int4Linear):
        if any((m.group_size, m.bits) != (first.group_size, first.bits) for m in layers):
            return None
        fused = Int4Linear(first.in_features, out_features, first.group_size,
                           first.bias is not None, first.bits, first.qweight.device)
        names = ("qweight", "scales", "zeros", "kernel_scales", "kernel_offsets")
    elif isinstance(first, Int8Linear):
        fused = Int8Linear(first.in_features, out_features, first.bias is not None,
                           device=first.qweight.device)
        names = ("qweight", "scales", "kernel_scales")
    else:
        return None
    for name in names:
        setattr(fused, name, torch.cat([getattr(m, name) for m in layers]))
    if first.bias is not None:
        fused.bias.data = torch.cat([m.bias.detach() for m in layers])
    return fused
