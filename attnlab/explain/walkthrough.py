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

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnlab.errors import BadInput
from attnlab.explain.subject import EncoderInput, OwnRun, Subject
from attnlab.explain.sublayers import (  # (the pieces every layer is made of)
    Check,
    Stage,
    attention_stages,
    diff,
    ffn_stages,
    residual_stage,
)


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
    subject, own, layer = w.subject, w.own, w.layer
    block = subject.layers[layer]
    attn = block.self_attn
    add, check = w.stages.append, w.checks.append
    toks = subject.tokens  # the rows of every (seq, ·) stage; the columns of (seq, seq)
    with torch.no_grad():
        x = own.layer_inputs[layer]  # (seq, d): what the model itself fed this layer
        if layer > 0:
            add(Stage(f"input of layer {layer}", f"output of layer {layer - 1}", x,
                      rows=toks))
        pre = block.attn_sublayer.pre_norm
        multihead = attention_stages(
            w, attn, block.attn_sublayer.norm(x) if pre else x, None, subject.mask,
            rows=toks, cols=toks, positional=subject.positional, positions=subject.positions,
            mask_note=getattr(subject, "mask_note", ""), own_weights=own.weights[layer],
            own_output=own.attention_outputs[layer], tol=tol, x_name="Norm(X)" if pre else "X")
        y = residual_stage(w, block.attn_sublayer, x, multihead, "residual + norm", toks,
                           "Y = X + MultiHead(Norm(X))" if pre else "Y = Norm(X + MultiHead)")
        sub = block.ffn_sublayer
        ffn_out = ffn_stages(w, block.ffn, sub.norm(y) if sub.pre_norm else y, rows=toks)
        out = residual_stage(w, sub, y, ffn_out, "layer output",
                             toks, "Y + FFN(Norm(Y))" if sub.pre_norm else "Norm(Y + FFN)")
        check(Check(f"layer {layer}'s output by hand equals the model's own forward pass",
                    diff(out, own.layer_outputs[layer]), tol))


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
