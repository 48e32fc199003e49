"""One query a row over a KV cache, on attnlab's CPU kernel: a decoding step's attention.

    out = softmax(s · q Kᵀ) V      q (batch, heads, 1, d),  K, V (batch, heads_kv, slots, d)

The same equation as :func:`attnlab.nn.attention.scaled_dot_product_attention`, computed by
``decode_attention`` (:mod:`attnlab.cpu.kernels`): the sums in float32 whatever the cache's
dtype, grouped queries read their shared key/value head in place, and each row stops at the last
slot its mask allows, so a static cache's empty tail is never read (PyTorch's fused CPU kernel
reads every slot). A row with no slot to attend gives zeros, as everywhere in attnlab.

:func:`attention_kernel_` swaps it into a finished model's attention layers from beside them
(:class:`DecodeAttention`); every other call (a prompt, weights asked for, a bias, dropout, a
gradient, another device) is the teaching path's.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from attnlab.cpu import kernels
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.multihead import MultiHeadAttention


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                     bias: Tensor | None = None, dropout_p: float = 0.0,
                     need_weights: bool = False, is_causal: bool = False,
                     scale: float | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~attnlab.nn.attention.scaled_dot_product_attention`, on the kernel where it
    applies (:func:`kernel_applies`); the same arguments and result."""
    if not need_weights and kernel_applies(q, k, v, mask, bias, dropout_p, is_causal):
        rows = None if mask is None else mask.reshape(-1, k.shape[-2]).contiguous()
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        return torch.ops.attnlab.decode_attention(q, k, v, rows, s)
    return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, dropout_p=dropout_p,
                                        need_weights=need_weights, is_causal=is_causal,
                                        scale=scale)


def kernel_applies(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                   dropout_p: float, is_causal: bool = False) -> bool:
    """One query a row on the CPU, float32, bfloat16 or float16 (k and v of one dtype, q of that
    or float32: the kernel's sums are float32), no bias, dropout or gradient, ``(batch, heads,
    len, d)`` tensors (grouped queries), and a mask (if any) that is one row of slots per batch
    row or one for all: ``(batch or 1, 1, 1, k_len)``, or fewer leading dimensions of size 1.
    (``is_causal`` with one query is no constraint: the last query sees every key.)"""
    if (q.shape[-2] != 1 or q.device.type != "cpu" or bias is not None or dropout_p > 0
            or not kernels.available()):
        return False
    if k.dtype not in kernels.FLOAT_DTYPES or q.dtype not in (k.dtype, torch.float32) or any(
            t.dim() != 4 or t.stride(-1) != 1 for t in (q, k, v)) or v.dtype != k.dtype:
        return False
    if (k.shape[0] != q.shape[0] or v.shape[:3] != k.shape[:3] or k.shape[-1] != q.shape[-1]
            or q.shape[1] % k.shape[1]):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return False
    if mask is None:
        return True
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    return (mask.dtype == torch.bool and mask.dim() <= 4 and shape[1:] == (1, 1, k.shape[-2])
            and shape[0] in (1, q.shape[0]))


class DecodeAttention(MultiHeadAttention):
    """:class:`~attnlab.nn.multihead.MultiHeadAttention` whose one-query steps run
    :func:`decode_attention`; its parameters, names and every other path are the layer's."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor | tuple[Tensor, Tensor]:
        return decode_attention(q, k, v, **kwargs)


def attention_kernel_(model: nn.Module) -> nn.Module:
    """Every CPU attention layer of ``model`` onto :func:`decode_attention`, in place (the same
    modules); returns ``model``. Cheap to call again; the kernels are built (or found wanting)
    now, never inside a compiled graph; a model elsewhere (a GPU, the meta device) is left as
    it is and builds nothing."""
    layers = [m for m in model.modules() if type(m) is MultiHeadAttention and _on_cpu(m)]
    if layers:
        kernels.available()
    for m in layers:
        m.__class__ = DecodeAttention
    return model


def _on_cpu(module: nn.Module) -> bool:
    """Whether ``module``'s tensors are on the CPU (an integer layer's codes are buffers)."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first is not None and first.device.type == "cpu"


__all__ = ["DecodeAttention", "attention_kernel_", "decode_attention", "kernel_applies"]
