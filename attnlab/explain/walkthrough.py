"""Follow one sentence through one encoder layer and one head, recomputing every stage.

Each stage is computed here by hand from the model's parameters (plain matrix products, a
softmax, a layer norm), and each :class:`Check` compares a hand-computed result with what the
library or the model's own forward pass produced. Nothing is asserted: a check reports the
measured difference and whether it is within tolerance.

:func:`walk` follows a sentence (its tokens, ids and embeddings, then the layer);
:func:`layer_stages`, the layer itself, is shared with the image walkthrough
(:mod:`attnlab.explain.image`: patches, [CLS] and positions, then the same layer).

The stages of encoder layer ℓ, head h (post-LN shown; pre-LN normalises before each sublayer):

    X            the layer's input (x₀ for ℓ = 0)                          (seq, d_model)
    Q, K, V      X·W_Q^h + b,  X·W_K^h + b,  X·W_V^h + b                   (seq, d_k)
    scores       Q·Kᵀ, then / √d_k, then masked                           (seq, seq)
    A            softmax over each row                                     (seq, seq)
    head_h       A·V                                                       (seq, d_k)
    MultiHead    Concat(head_1..head_H)·W_O + b_O                          (seq, d_model)
    Y            Norm(X + MultiHead)                                       (seq, d_model)
    FFN          act(Y·W₁ + b₁)·W₂ + b₂                                    (seq, d_model)
    out          Norm(Y + FFN)                                             (seq, d_model)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import BadInput
from attnlab.explain.subject import EncoderInput, OwnRun, Subject
from attnlab.nn import scaled_dot_product_attention
from attnlab.nn.feedforward import GATES


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


@dataclass
class Walkthrough:
    subject: EncoderInput  # a Subject (a sentence) or an image's ImageSubject
    layer: int
    head: int
    stages: list[Stage] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    own: OwnRun | None = None  # the model's own run: every layer's weights, for the pictures

    def stage(self, title: str) -> Stage:
        return next(s for s in self.stages if s.title == title)


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


def begin(subject: EncoderInput, layer: int = 0, head: int = 0) -> Walkthrough:
    """An empty walkthrough of ``layer``/``head`` holding the model's own run of ``subject``
    (a one-line BadInput for a layer or head the model does not have)."""
    n_layers = len(subject.layers)
    if not 0 <= layer < n_layers:
        raise BadInput(f"--layer {layer}: the model has layers 0..{n_layers - 1}")
    n_heads = subject.layers[layer].self_attn.n_heads
    if not 0 <= head < n_heads:
        raise BadInput(f"--head {head}: the layer has heads 0..{n_heads - 1}")
    w = Walkthrough(subject, layer, head)
    w.own = subject.run_model()
    return w


def walk(subject: Subject, layer: int = 0, head: int = 0, tol: float = 1e-5) -> Walkthrough:
    """Every stage of ``layer``/``head`` for ``subject``, with the checks made on the way."""
    w = begin(subject, layer, head)
    own = w.own
    add, check = w.stages.append, w.checks.append

    add(Stage("tokens", "pieces of the sentence", subject.tokens))
    add(Stage("ids", "vocabulary index of each piece", subject.ids[0].tolist()))
    add(Stage("token embeddings", "E[ids]" + (" · √d_model" if getattr(
        subject.model.config, "scale_embeddings", False) else ""), subject.token_embedding,
              rows=subject.tokens))
    add(Stage("positional encodings", f"{subject.model.config.positional} positions",
              subject.position_embedding, rows=subject.tokens))
    if subject.segment_embedding is not None:
        add(Stage("segment embeddings", "S[token type] (all sentence A here)",
                  subject.segment_embedding, rows=subject.tokens))
    add(Stage("sum", subject.x0_formula, subject.x0, rows=subject.tokens))
    check(Check("x₀ by hand equals the input the model's first layer received",
                diff(subject.x0, own.layer_inputs[0]), tol))
    layer_stages(w, tol)
    return w


def layer_stages(w: Walkthrough, tol: float = 1e-5) -> None:
    """Append the stages and checks of encoder layer ``w.layer``, head ``w.head`` (Q, K, V to
    the layer's output: the module docstring) to ``w``, for any encoder input: a sentence's
    tokens or an image's patches. The layer's input is the one the model itself fed it."""
    subject, own, layer, head = w.subject, w.own, w.layer, w.head
    block = subject.layers[layer]
    attn = block.self_attn
    add, check = w.stages.append, w.checks.append
    toks = subject.tokens  # the rows of every (seq, ·) stage; the columns of (seq, seq)
    with torch.no_grad():
        x = own.layer_inputs[layer]  # (seq, d): what the model itself fed this layer
        if layer > 0:
            add(Stage(f"input of layer {layer}", f"output of layer {layer - 1}", x,
                      rows=toks))
        x_attn = block.attn_sublayer.norm(x) if block.attn_sublayer.pre_norm else x
        d_k, n_heads = attn.d_k, attn.n_heads
        wq, bq, wk, bk, wv, bv = _projections(attn)
        q_all = (x_attn @ wq.T + bq).view(-1, n_heads, d_k).transpose(0, 1)  # (H, seq, d_k)
        k_all = (x_attn @ wk.T + bk).view(-1, attn.num_kv_heads, d_k).transpose(0, 1)
        v_all = (x_attn @ wv.T + bv).view(-1, attn.num_kv_heads, d_k).transpose(0, 1)
        q_all, k_all = subject.positional.rotate(q_all, k_all, subject.positions,
                                                 subject.positions)
        groups = n_heads // attn.num_kv_heads
        k_all, v_all = (t.repeat_interleave(groups, 0) for t in (k_all, v_all))
        rows = slice(head * d_k, (head + 1) * d_k)
        add(Stage("W_Q, W_K, W_V", f"head {head}'s columns of each projection",
                  None, f"each {tuple(wq[rows].T.shape)} (d_model × d_k); all heads together "
                        f"{tuple(wq.T.shape)}"))
        q, k, v = q_all[head], k_all[head], v_all[head]
        x_name = "Norm(X)" if block.attn_sublayer.pre_norm else "X"
        rotated = "RoPE({})" if subject.model.config.positional == "rope" else "{}"
        add(Stage("Q", rotated.format(f"{x_name} · W_Q + b_Q"), q, rows=toks))
        add(Stage("K", rotated.format(f"{x_name} · W_K + b_K"), k, rows=toks))
        add(Stage("V", f"{x_name} · W_V + b_V", v, rows=toks))
        scores = q @ k.T
        add(Stage("scores", "Q · Kᵀ", scores, rows=toks, cols=toks))
        scale = 1 / math.sqrt(d_k) if attn.scale is None else attn.scale  # T5: 1
        add(Stage("scaled scores", f"Q · Kᵀ / √d_k  (√{d_k} = {math.sqrt(d_k):.4f})"
                  if attn.scale is None else f"Q · Kᵀ · {scale:g}", scores * scale,
                  rows=toks, cols=toks))
        seq = x.shape[0]
        bias = subject.positional.attention_bias(subject.positions, seq)
        if bias is not None and bias.shape[1] > 1 and bias.shape[1] != n_heads:
            bias = bias[:, attn.original_heads]  # a pruned layer: its heads' rows
        mask = subject.mask
        add(Stage("mask", f"True = may attend ({getattr(subject, 'mask_note', 'all True')})",
                  mask.int(), rows=toks, cols=toks))
        # All heads at once (the head's stages are slices of these): (H, seq, seq)
        scaled_all = q_all @ k_all.transpose(-2, -1) * scale
        if bias is not None:  # ALiBi's distance penalty, per head
            scaled_all = scaled_all + bias[0]
        weights_all = scaled_all.masked_fill(~mask, float("-inf")).softmax(-1)
        weights = weights_all[head]
        add(Stage("attention weights", "A = softmax(masked scores), row by row", weights,
                  rows=toks, cols=toks))
        check(Check("each row of A sums to 1", float((weights.sum(-1) - 1).abs().max()), 1e-6))
        out_head = weights @ v
        add(Stage("weighted sum of V", f"head_{head} = A · V", out_head, rows=toks))
        by_hand = torch.stack([sum(weights[i, j] * v[j] for j in range(v.shape[0]))
                               for i in range(weights.shape[0])])
        check(Check("Σ_j A_ij·V_j, summed one term at a time, equals the product A·V",
                    diff(by_hand, out_head), tol))
        check(Check(f"head {head}'s weights equal the model's own (need_weights)",
                    diff(weights, own.weights[layer][head]), tol))
        explicit, _ = scaled_dot_product_attention(q_all[None], k_all[None], v_all[None],
                                                   mask=mask, bias=bias, need_weights=True)
        fused = scaled_dot_product_attention(q_all[None], k_all[None], v_all[None], mask=mask,
                                             bias=bias)
        check(Check("explicit and fused (torch SDPA) attention paths agree",
                    diff(explicit, fused), tol))
        concat = (weights_all @ v_all).transpose(0, 1).reshape(seq, n_heads * d_k)
        add(Stage("concatenated heads", f"Concat(head_0..head_{n_heads - 1})", concat,
                  rows=toks))
        multihead = concat @ attn.out_proj.weight.T + _bias(attn.out_proj)
        add(Stage("multi-head output", "Concat · W_O + b_O", multihead,
                  f"W_O {tuple(attn.out_proj.weight.T.shape)}", rows=toks))
        check(Check("Concat·W_O equals the model's own self-attention output",
                    diff(multihead, own.attention_outputs[layer]), tol))
        _, y = _sublayer(block.attn_sublayer, x, lambda h: multihead)
        add(Stage("residual + norm", "Y = Norm(X + MultiHead)" if not
                  block.attn_sublayer.pre_norm else "Y = X + MultiHead(Norm(X))", y,
                  rows=toks))
        ffn = block.ffn
        ffn_in = block.ffn_sublayer.norm(y) if block.ffn_sublayer.pre_norm else y
        hidden = ffn_in @ ffn.w1.weight.T + _bias(ffn.w1)
        hidden = (_activate(GATES[ffn.activation], hidden)
                  * (ffn_in @ ffn.w3.weight.T + _bias(ffn.w3))
                  if ffn.w3 is not None else _activate(ffn.activation, hidden))
        add(Stage("feed-forward hidden", f"{ffn.activation}(Y · W₁ + b₁)", hidden,
                  f"W₁ {tuple(ffn.w1.weight.T.shape)}", rows=toks))
        ffn_out = hidden @ ffn.w2.weight.T + _bias(ffn.w2)
        add(Stage("feed-forward output", "FFN = hidden · W₂ + b₂", ffn_out,
                  f"W₂ {tuple(ffn.w2.weight.T.shape)}", rows=toks))
        _, out = _sublayer(block.ffn_sublayer, y, lambda h: ffn_out)
        add(Stage("layer output", "Norm(Y + FFN)" if not block.ffn_sublayer.pre_norm
                  else "Y + FFN(Norm(Y))", out, rows=toks))
        check(Check(f"layer {layer}'s output by hand equals the model's own forward pass",
                    diff(out, own.layer_outputs[layer]), tol))


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


@torch.no_grad()
def compare_word(subject_a: Subject, subject_b: Subject, word: str | None = None) -> dict:
    """The contextual (last layer output) and static (input embedding row) vectors of a piece
    shared by both sentences, and their cosines."""
    shared = [t for t in subject_a.tokens if t in subject_b.tokens and not t.startswith("[")
              and t not in ("<eos>", "<bos>")]
    if word is None:
        if not shared:
            raise BadInput("the two sentences share no token to compare")
        word = max(shared, key=len)
    if word not in subject_a.tokens or word not in subject_b.tokens:
        raise BadInput(f"{word!r} is not a token of both sentences")
    i, j = subject_a.tokens.index(word), subject_b.tokens.index(word)
    ctx_a = subject_a.run_model().layer_outputs[-1][i]
    ctx_b = subject_b.run_model().layer_outputs[-1][j]
    static_a, static_b = subject_a.token_embedding[i], subject_b.token_embedding[j]
    return {"word": word, "contextual_a": ctx_a, "contextual_b": ctx_b,
            "contextual_cos": float(F.cosine_similarity(ctx_a, ctx_b, dim=0)),
            "static_a": static_a, "static_b": static_b,
            "static_cos": float(F.cosine_similarity(static_a, static_b, dim=0)),
            "static_identical": bool(torch.equal(static_a, static_b))}
