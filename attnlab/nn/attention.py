"""Scaled dot-product attention (Vaswani et al., 2017, eq. 1).

    Attention(Q, K, V) = softmax(s · Q Kᵀ + B) V,    s = 1/√d_k by default

T5 uses s = 1: its initialisation already keeps Q Kᵀ small, and its relative position bias B is
learned on the unscaled scores.

Shapes: ``q`` is ``(batch, heads, q_len, d_k)``, ``k`` is ``(batch, heads, k_len, d_k)``,
``v`` is ``(batch, heads, k_len, d_v)``; the output is ``(batch, heads, q_len, d_v)``.

Mask convention, the same everywhere in attnlab: a **boolean** tensor where ``True`` means
"may attend", broadcastable to ``(batch, heads, q_len, k_len)``. ``B`` is an optional additive
float bias of the same broadcast shape (ALiBi slopes, relative positions).

Two paths, one result:

* the *explicit* path writes the equation out and can return the attention weights
  (for teaching, inspection and plots);
* the *fused* path calls :func:`torch.nn.functional.scaled_dot_product_attention`, which picks a
  flash / memory-efficient kernel where it can (for speed).

(Decoding on a CPU swaps in a third, one query a row over a cache, from beside the model:
:mod:`attnlab.cpu.attention`.)

A query row whose every key is masked has nothing to attend to. Softmax over an empty set is
undefined (0/0 = NaN in floating point); we define its output, and its weights, to be zeros.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.masks import causal_mask, combine_masks


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(scale·QKᵀ + bias)·V with a boolean ``mask`` (True = may attend).

    Args:
        q: ``(batch, heads, q_len, d_k)``.
        k: ``(batch, heads_kv, k_len, d_k)``; ``heads_kv`` may divide ``heads``
            (grouped-query attention: each key/value head serves ``heads // heads_kv`` queries).
        v: ``(batch, heads_kv, k_len, d_v)``.
        mask: boolean, broadcastable to ``(batch, heads, q_len, k_len)``.
        bias: additive float bias, broadcastable to ``(batch, heads, q_len, k_len)``.
        dropout_p: dropout probability on the attention weights (pass 0.0 in eval).
        need_weights: if True use the explicit path and also return the weights
            ``(batch, heads, q_len, k_len)``.
        is_causal: shorthand for a causal mask aligned so that the last query sees the last key
            (query ``i`` may attend keys ``j <= i + k_len - q_len``); combined with ``mask``.
        scale: the factor s on the scores; None: 1/√d_k (T5: 1.0).

    Returns:
        ``out`` ``(batch, heads, q_len, d_v)``, or ``(out, weights)`` when ``need_weights``.
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    if is_causal and q_len == 1:
        is_causal = False  # one query at the end of the sequence may attend every key
    if is_causal and (mask is not None or bias is not None or need_weights or q_len != k_len):
        # SDPA's own is_causal is top-left aligned and exclusive with attn_mask: spell it out.
        mask = combine_masks(mask, causal_mask(q_len, k_len, q.device))
        is_causal = False
    if bias is not None and bias.dtype != q.dtype:  # ALiBi's float32 distances, bf16 queries
        bias = bias.to(q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if need_weights:
        return _explicit(q, k.to(q.dtype), v.to(q.dtype), mask, bias, dropout_p, scale)
    if k.dtype != q.dtype:  # a 16-bit KV cache under float32 queries: widened for the rest
        k, v = k.to(q.dtype), v.to(q.dtype)
    if _composed_is_faster(q, k_len):
        if is_causal:
            mask = causal_mask(q_len, k_len, q.device)
        return _explicit(q, k, v, mask, bias, dropout_p, scale)[0]
    return _fused(q, k, v, mask, bias, dropout_p, is_causal, scale)


# On a CPU in reduced precision, PyTorch's flash kernel lost to the same equation composed from
# matmuls up to about 512×512 scores, and won beyond (in float32 it won at every size): so
# there the fast path composes it (benchmarks/attention.py; docs/benchmarks.md).
_COMPOSED_MAX_SCORES = 512 * 512


def _composed_is_faster(q: Tensor, k_len: int) -> bool:
    # Not for one-query decoding steps: there the fused kernel reads K and V once, while the
    # composed path would first copy them per query head under grouped-query attention.
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
            and 1 < q.shape[-2] and q.shape[-2] * k_len <= _COMPOSED_MAX_SCORES)


def _repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """Grouped-query attention: repeat each key/value head for the query heads it serves."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _explicit(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """The equation written out; returns ``(output, weights)``."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    # Scaling q (seq × d_k) rather than the scores (seq × seq) is the same product, cheaper.
    scores = (q * scale) @ k.transpose(-2, -1)  # (b, h, q_len, k_len)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        # The most negative finite value, not -inf: exp() of it underflows to exactly 0, and a
        # row that is masked everywhere stays finite (uniform) instead of 0/0, so neither the
        # forward nor the backward pass sees a NaN; such rows are zeroed just below.
        scores = scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        empty_rows = ~mask.any(dim=-1, keepdim=True)
        # on CPU, look first: cheap (not in a compiled or exported graph: it has no values)
        if mask.device.type != "cpu" or torch.compiler.is_compiling() or bool(empty_rows.any()):
            weights = weights.masked_fill(empty_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def _fused(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float,
) -> Tensor:
    """torch's fused kernel; the mask is converted here, at the SDPA boundary."""
    empty_rows = None
    attn_mask: Tensor | None = mask
    if mask is not None:
        # Kernels disagree on what a fully masked row gives (NaN on some). Let such rows attend
        # everywhere, which is finite on every backend, and zero them afterwards. On CPU we
        # look first (no device sync to pay): usually there are none, and the zeroing pass
        # would copy the whole output. A compiled or exported graph keeps both steps.
        empty_rows = ~mask.any(dim=-1, keepdim=True)
        if (mask.device.type == "cpu" and not torch.compiler.is_compiling()
                and not bool(empty_rows.any())):
            empty_rows = None
        else:
            attn_mask = mask | empty_rows
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
    enable_gqa = k.shape[1] != q.shape[1]
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        enable_gqa=enable_gqa, scale=scale,
    )
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out
