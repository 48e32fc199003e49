"""One sublayer of a Transformer layer, recomputed by hand as stages of a walkthrough.

Every layer of every stack is made of the same three pieces, and the walkthroughs follow each
of them with these functions (an encoder layer, a decoder-only block, the encoder–decoder's
decoder layer):

    attention    Q = X_q·W_Q + b,  K = X_kv·W_K + b,  V = X_kv·W_V + b      (q, d_k), (k, d_k)
                 A = softmax(mask(Q·Kᵀ·s + B)),  head = A·V,  MultiHead = Concat·W_O + b_O
                 self-attention: X_kv = X_q; cross-attention: X_kv = the encoder's memory
    residual     post-LN: Norm(X + F),   pre-LN: X + F(Norm(X))
    feed-forward act(X·W₁ + b₁)·W₂ + b₂   (a gated one: (act(X·W₁) ⊙ X·W₃)·W₂)

A norm is written out too (:func:`norm_by_hand`): LayerNorm γ ⊙ (x − μ)/√(σ² + ε) + β and
RMSNorm γ ⊙ x/√(mean(x²) + ε). A :class:`Stage` is one value shown, a :class:`Check` one
difference measured (both also read from :mod:`attnlab.explain.walkthrough`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn import scaled_dot_product_attention
from attnlab.nn.feedforward import GATES

if TYPE_CHECKING:
    from attnlab.explain.walkthrough import Walkthrough


@dataclass
class Stage:
    title: str
    formula: str
    value: Tensor | list | None
    note: str = ""
    rows: list[str] | None = None  # labels of a matrix value's rows (tokens), when it has them
    cols: list[str] | None = None  # labels of its columns: tokens for a token × token matrix

    @property
    def shape(self) -> tuple[int, ...] | None:
        return tuple(self.value.shape) if isinstance(self.value, Tensor) else None


@dataclass
class Check:
    name: str
    error: float  # the measured difference
    tol: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.tol


def diff(a: Tensor, b: Tensor) -> float:
    """The largest absolute difference of ``a`` and ``b``, in float64."""
    return float((a.double() - b.double()).abs().max())


def _sublayer(residual, x: Tensor, f) -> tuple[Tensor, Tensor]:
    """``(F's output, the sublayer's output)`` for post-LN or pre-LN placement."""
    if residual.pre_norm:
        out = f(residual.norm(x))
        return out, x + out
    out = f(x)
    return out, residual.norm(x + out)


def _projections(attn):
    """``W_Q, b_Q, W_K, b_K, W_V, b_V`` as (out, in) matrices, fused or separate."""
    if attn.fused_qkv:
        w, b = attn.qkv.weight, attn.qkv.bias
        cuts = [attn.q_dim, attn.q_dim + attn.kv_dim]
        ws = (w[: cuts[0]], w[cuts[0] : cuts[1]], w[cuts[1] :])
        bs = (None,) * 3 if b is None else (b[: cuts[0]], b[cuts[0] : cuts[1]], b[cuts[1] :])
    else:
        ws = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
        bs = (attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
    out = []
    for wi, bi in zip(ws, bs, strict=True):
        out += [wi, 0 if bi is None else bi]
    return out


def _bias(linear) -> Tensor | int:
    return 0 if linear.bias is None else linear.bias


def _activate(name: str, x: Tensor) -> Tensor:
    if name == "relu":
        return x.clamp(min=0)
    if name == "gelu":  # x · Φ(x), Φ the standard normal CDF
        return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    if name == "silu":  # x · σ(x)
        return x * torch.sigmoid(x)
    if name == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise BadInput(f"unknown activation {name!r}")




def attention_stages(w: Walkthrough, attn: nn.Module, x_q: Tensor, x_kv: Tensor | None,
                     mask: Tensor, name: str = "", *, rows: list[str], cols: list[str],
                     positional: nn.Module | None = None, positions: Tensor | None = None,
                     mask_note: str = "", own_weights: Tensor | None = None,
                     own_output: Tensor | None = None, tol: float = 1e-5,
                     x_name: str = "X", kv_name: str | None = None,
                     kind: str = "self-attention") -> Tensor:
    """Append the stages and checks of one attention sublayer, head ``w.head``, to ``w``;
    return its output ``Concat·W_O + b_O`` ``(q, d_model)``.

    ``x_q (q, d_model)`` gives the queries, ``x_kv (k, d_model)`` the keys and values (None:
    self-attention, ``x_q`` itself; its positions then rotate Q and K (RoPE) and add their
    score bias (ALiBi, T5)). ``mask (q, k)`` is boolean, True = may attend. ``rows``/``cols``
    name the queries and the keys. ``own_weights (heads, q, k)`` and ``own_output (q, d)``
    are the model's own, recorded by hooks; ``name`` prefixes each stage's title, ``kind``
    names the sublayer in the check against ``own_output``."""
    add, check = w.stages.append, w.checks.append
    head = w.head

    def title(what: str) -> str:
        return f"{name}: {what}" if name else what

    kv = x_q if x_kv is None else x_kv
    kv_name = x_name if kv_name is None else kv_name
    d_k, n_heads = attn.d_k, attn.n_heads
    wq, bq, wk, bk, wv, bv = _projections(attn)
    q_all = (x_q @ wq.T + bq).view(-1, n_heads, d_k).transpose(0, 1)  # (H, q, d_k)
    k_all = (kv @ wk.T + bk).view(-1, attn.num_kv_heads, d_k).transpose(0, 1)  # (H_kv, k, d_k)
    v_all = (kv @ wv.T + bv).view(-1, attn.num_kv_heads, d_k).transpose(0, 1)
    bias, rotated = None, "{}"
    if x_kv is None and positional is not None:
        q_all, k_all = positional.rotate(q_all, k_all, positions, positions)
        bias = positional.attention_bias(positions, kv.shape[0])
        if bias is not None and bias.shape[1] > 1 and bias.shape[1] != n_heads:
            bias = bias[:, attn.original_heads]  # a pruned layer: its heads' rows
        if w.subject.model.config.positional == "rope":
            rotated = "RoPE({})"
    groups = n_heads // attn.num_kv_heads  # grouped-query attention: K, V shared by a group
    k_all, v_all = (t.repeat_interleave(groups, 0) for t in (k_all, v_all))
    cut = slice(head * d_k, (head + 1) * d_k)
    add(Stage(title("W_Q, W_K, W_V"), f"head {head}'s columns of each projection", None,
              f"each {tuple(wq[cut].T.shape)} (d_model × d_k); all heads together "
              f"{tuple(wq.T.shape)}"))
    q, k, v = q_all[head], k_all[head], v_all[head]
    add(Stage(title("Q"), rotated.format(f"{x_name} · W_Q + b_Q"), q, rows=rows))
    add(Stage(title("K"), rotated.format(f"{kv_name} · W_K + b_K"), k, rows=cols))
    add(Stage(title("V"), f"{kv_name} · W_V + b_V", v, rows=cols))
    scores = q @ k.T
    add(Stage(title("scores"), "Q · Kᵀ", scores, rows=rows, cols=cols))
    scale = 1 / math.sqrt(d_k) if attn.scale is None else attn.scale  # T5: 1
    add(Stage(title("scaled scores"), f"Q · Kᵀ / √d_k  (√{d_k} = {math.sqrt(d_k):.4f})"
              if attn.scale is None else f"Q · Kᵀ · {scale:g}", scores * scale,
              rows=rows, cols=cols))
    add(Stage(title("mask"), f"True = may attend ({mask_note or 'all True'})", mask.int(),
              rows=rows, cols=cols))
    # all heads at once (the head's stages are slices of these): (H, q, k)
    scaled_all = q_all @ k_all.transpose(-2, -1) * scale
    if bias is not None:  # ALiBi's distances, T5's learned relative bias: per head
        scaled_all = scaled_all + bias[0]
    weights_all = scaled_all.masked_fill(~mask, float("-inf")).softmax(-1)
    weights = weights_all[head]
    add(Stage(title("attention weights"), "A = softmax(masked scores), row by row", weights,
              rows=rows, cols=cols))
    check(Check(title("each row of A sums to 1"),
                float((weights.sum(-1) - 1).abs().max()), 1e-6))
    out_head = weights @ v
    add(Stage(title("weighted sum of V"), f"head_{head} = A · V", out_head, rows=rows))
    one_by_one = torch.stack([sum(weights[i, j] * v[j] for j in range(v.shape[0]))
                              for i in range(weights.shape[0])])
    check(Check(title("Σ_j A_ij·V_j, summed one term at a time, equals the product A·V"),
                diff(one_by_one, out_head), tol))
    if own_weights is not None:
        check(Check(title(f"head {head}'s weights equal the model's own (need_weights)"),
                    diff(weights, own_weights[head]), tol))
    explicit, _ = scaled_dot_product_attention(q_all[None], k_all[None], v_all[None],
                                               mask=mask, bias=bias, need_weights=True)
    fused = scaled_dot_product_attention(q_all[None], k_all[None], v_all[None], mask=mask,
                                         bias=bias)
    check(Check(title("explicit and fused (torch SDPA) attention paths agree"),
                diff(explicit, fused), tol))
    concat = (weights_all @ v_all).transpose(0, 1).reshape(x_q.shape[0], n_heads * d_k)
    add(Stage(title("concatenated heads"), f"Concat(head_0..head_{n_heads - 1})", concat,
              rows=rows))
    multihead = concat @ attn.out_proj.weight.T + _bias(attn.out_proj)
    add(Stage(title("multi-head output"), "Concat · W_O + b_O", multihead,
              f"W_O {tuple(attn.out_proj.weight.T.shape)}", rows=rows))
    if own_output is not None:
        check(Check(title(f"Concat·W_O equals the model's own {kind} output"),
                    diff(multihead, own_output), tol))
    return multihead


def residual_stage(w: Walkthrough, residual: nn.Module, x: Tensor, f_out: Tensor, title: str,
                   rows: list[str], formula: str | None = None) -> Tensor:
    """Append the residual sublayer's output — post-LN ``Norm(x + F)``, pre-LN ``x + F``
    (F having read ``Norm(x)``) — and return it ``(seq, d_model)``."""
    _, out = _sublayer(residual, x, lambda h: f_out)
    if formula is None:
        formula = "X + F(Norm(X))" if residual.pre_norm else "Norm(X + F(X))"
    w.stages.append(Stage(title, formula, out, rows=rows))
    return out


def ffn_stages(w: Walkthrough, ffn: nn.Module, x: Tensor, name: str = "",
               rows: list[str] | None = None, x_name: str = "Y") -> Tensor:
    """Append the feed-forward's hidden layer and output for its input ``x (seq, d_model)``
    (already normed where the layer is pre-LN); return ``FFN(x)`` ``(seq, d_model)``."""

    def title(what: str) -> str:
        return f"{name}: {what}" if name else what

    hidden = x @ ffn.w1.weight.T + _bias(ffn.w1)
    hidden = (_activate(GATES[ffn.activation], hidden) * (x @ ffn.w3.weight.T + _bias(ffn.w3))
              if ffn.w3 is not None else _activate(ffn.activation, hidden))
    w.stages.append(Stage(title("feed-forward hidden"), f"{ffn.activation}({x_name} · W₁ + b₁)",
                          hidden, f"W₁ {tuple(ffn.w1.weight.T.shape)}", rows=rows))
    out = hidden @ ffn.w2.weight.T + _bias(ffn.w2)
    w.stages.append(Stage(title("feed-forward output"), "FFN = hidden · W₂ + b₂", out,
                          f"W₂ {tuple(ffn.w2.weight.T.shape)}", rows=rows))
    return out


def norm_by_hand(norm: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm or RMSNorm of ``x (..., d)`` written out from its parameters (module doc)."""
    if isinstance(norm, nn.LayerNorm):
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)  # biased, as LayerNorm's
        out = (x - mu) / torch.sqrt(var + norm.eps)
        if norm.weight is not None:
            out = out * norm.weight
        return out if norm.bias is None else out + norm.bias
    if hasattr(norm, "eps") and hasattr(norm, "weight"):  # RMSNorm: no centring, no bias
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight
    return norm(x)  # a norm of another kind: the module itself


__all__ = ["attention_stages", "residual_stage", "ffn_stages", "norm_by_hand"]
