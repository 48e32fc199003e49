"""The network text's complete forward pass: "I love" → the first French token, d_model = 4,
one layer each side, one attention head of width d_k = 2, d_ff = 8, post-LN (γ = 1, β = 0).

The text states the embeddings, the positions, the encoder's W^Q, W^K, W^V and the start
token's embedding. It does not state W^O, the feed-forward weights, the decoder's attention
weights or the output projection; those are drawn here from a fixed seed and shown, so the
whole pass can be computed and checked against attnlab's own
:class:`~attnlab.nn.EncoderLayer` and :class:`~attnlab.nn.DecoderLayer` loaded with the same
numbers. The text's own later numbers come from weights it does not give; where its steps
can be redone from its own printed intermediates (the residual, the LayerNorms), they are.

    encoder:  X = E + PE;  A = softmax(X·W^Q·(X·W^K)ᵀ/√2);  X' = Norm(X + A·X·W^V·W^O)
              memory = Norm(X' + FFN(X')),  FFN(x) = ReLU(x·W₁ + b₁)·W₂ + b₂
    decoder:  Y = E[<S>] + PE[0];  Y' = Norm(Y + SelfAttn(Y));  Y'' = Norm(Y' + CrossAttn(Y',
              memory));  h = Norm(Y'' + FFN(Y''));  p = softmax(h·W_U)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.explain.examples.base import (
    ExampleResult,
    diff,
    layer_norm_rows,
    softmax_rows,
    tensor,
)
from attnlab.nn import DecoderLayer, EncoderLayer

SRC = ["I", "love"]
VOCAB = ["<S>", "<E>", "I", "love", "Je", "t'", "aime"]
SEED = 0
WHY_QKV = ("the text's Q, K and V do not follow from its X and weights: Q's first entry is "
           "0.5·0.5 + 0.7·(−0.2) + 0.2·0.3 + 1.8·0.1 = 0.35; from its own Q, K and V the "
           "text's arithmetic is right (the steps marked \"text's\")")
WHY_AFTER = "follows from the text's Q, K and V (above)"
WHY_NORM = ("a LayerNorm row (γ = 1, β = 0) has mean 0 and mean square 1; the text's rows "
            "sum to {sums}; the LayerNorm of its own input is the value shown")


def forward_pass(r: ExampleResult) -> None:
    w = _weights(r)
    memory = _encoder(r, w)
    _decoder(r, w, memory)


def _weights(r: ExampleResult) -> dict[str, Tensor]:
    """The text's weights, then the ones it leaves out, drawn from N(0, 1/fan_in)."""
    w = {"W^Q": tensor([[0.5, 0.1], [-0.2, 0.4], [0.3, -0.1], [0.1, 0.2]]),
         "W^K": tensor([[0.3, 0.2], [0.1, 0.5], [-0.1, 0.3], [0.4, 0.1]]),
         "W^V": tensor([[0.4, 0.1], [0.2, 0.3], [-0.1, 0.4], [0.3, 0.2]])}
    for name in w:
        r.step(f"{name} (given)", "encoder self-attention, d_model 4 → d_k 2", w[name])
    g = torch.Generator().manual_seed(SEED)
    shapes = {"W^O": (2, 4), "W₁": (4, 8), "b₁": (8,), "W₂": (8, 4), "b₂": (4,),
              "dec W^Q": (4, 2), "dec W^K": (4, 2), "dec W^V": (4, 2), "dec W^O": (2, 4),
              "cross W^Q": (4, 2), "cross W^K": (4, 2), "cross W^V": (4, 2),
              "cross W^O": (2, 4), "dec W₁": (4, 8), "dec b₁": (8,), "dec W₂": (8, 4),
              "dec b₂": (4,), "W_U": (4, len(VOCAB))}
    for name, shape in shapes.items():
        fan_in = shape[0] if len(shape) == 2 else 4
        w[name] = torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in)
        r.step(f"{name} (not stated: seed {SEED})", f"N(0, 1/{fan_in})", w[name])
    return w


def _encoder(r: ExampleResult, w: dict[str, Tensor]) -> Tensor:
    e = r.step("E (given)", "embeddings of \"I\", \"love\"",
               [[0.5, -0.3, 0.2, 0.8], [0.1, 0.7, -0.4, 0.3]], SRC)
    pe = r.step("PE (given)", "the text's rounded PE[0], PE[1]",
                [[0.0, 1.0, 0.0, 1.0], [0.84, 0.54, 0.01, 1.0]], SRC)
    x = r.step("X", "E + PE", e + pe, SRC)
    r.compare("X", "[[0.5, 0.7, 0.2, 1.8], [0.94, 1.24, -0.39, 1.3]]", x)
    q = r.step("Q", "X·W^Q", x @ w["W^Q"], SRC)
    k = r.step("K", "X·W^K", x @ w["W^K"], SRC)
    v = r.step("V", "X·W^V", x @ w["W^V"], SRC)
    r.compare("Q", "[[0.56, 0.65], [0.47, 0.84]]", q, why=WHY_QKV)
    r.compare("K", "[[0.95, 0.75], [0.89, 1.05]]", k, why=WHY_QKV)
    r.compare("V", "[[0.69, 0.60], [0.75, 0.55]]", v, why=WHY_QKV)
    s = r.step("scores", "Q·Kᵀ/√2", q @ k.T / math.sqrt(2), SRC, SRC)
    r.compare("scores", "[[0.72, 0.84], [0.77, 0.92]]", s, why=WHY_AFTER)
    a = r.step("A", "softmax over each row", softmax_rows(s), SRC, SRC)
    r.compare("A", "[[0.47, 0.53], [0.46, 0.54]]", a, why=WHY_AFTER)
    ctx = r.step("context", "A·V", a @ v, SRC)
    r.compare("context", "[[0.72, 0.57], [0.72, 0.57]]", ctx, why=WHY_AFTER)
    _text_attention(r)

    attn = r.step("attention output", "context·W^O", ctx @ w["W^O"], SRC)
    x1 = r.step("X'", "LayerNorm(X + attention output)", layer_norm_rows(x + attn), SRC)
    ffn = r.step("FFN(X')", "ReLU(X'·W₁ + b₁)·W₂ + b₂", _ffn(x1, w, ""), SRC)
    memory = r.step("memory", "LayerNorm(X' + FFN(X')): the encoder's output",
                    layer_norm_rows(x1 + ffn), SRC)
    _text_norms(r)

    layer = _encoder_layer(w)
    with torch.no_grad():
        own = layer(x[None], need_weights=True)[0]
    r.check("A vs attnlab.nn.EncoderLayer's attention weights", diff(a, layer.attn_weights),
            1e-12)
    r.check("memory vs attnlab.nn.EncoderLayer (post-LN) with these weights",
            diff(memory, own), 1e-12)
    return memory


def _text_attention(r: ExampleResult) -> None:
    """The text's attention redone from its own printed Q, K and V."""
    q, k, v = (tensor(m) for m in ([[0.56, 0.65], [0.47, 0.84]], [[0.95, 0.75], [0.89, 1.05]],
                                   [[0.69, 0.60], [0.75, 0.55]]))
    raw = r.step("text's Q·Kᵀ", "from the text's printed Q and K", q @ k.T, SRC, SRC)
    r.compare("text's Q·Kᵀ", "[[1.02, 1.18], [1.08, 1.30]]", raw)
    a = r.step("text's A", "softmax(text's Q·Kᵀ/√2)", softmax_rows(raw / math.sqrt(2)), SRC, SRC)
    r.compare("text's A", "[[0.47, 0.53], [0.46, 0.54]]", a)
    r.compare("text's context", "[[0.72, 0.57], [0.72, 0.57]]",
              r.step("text's context", "text's A·V", a @ v, SRC))


def _text_norms(r: ExampleResult) -> None:
    """The text's residual and LayerNorms, redone from its own printed intermediates."""
    x = tensor([[0.5, 0.7, 0.2, 1.8], [0.94, 1.24, -0.39, 1.3]])
    attn = r.step("text's attention output (printed)", "from weights it does not state",
                  [[0.72, 0.57, 0.45, 0.63], [0.72, 0.57, 0.48, 0.61]], SRC)
    res = r.step("text's X + attention output", "the residual", x + attn, SRC)
    r.compare("text's X + attention output", "[[1.22, 1.27, 0.65, 2.43], "
              "[1.66, 1.81, 0.09, 1.91]]", res)
    normed = r.step("text's LayerNorm(X + attention output)", "per row",
                    layer_norm_rows(res), SRC)
    printed = "[[-0.71, -0.61, -1.15, 0.88], [-0.23, 0.10, -1.40, 0.55]]"
    r.compare("text's LayerNorm(X + attention output)", printed, normed,
              why=WHY_NORM.format(sums=_row_sums(printed)))
    ffn = r.step("text's FFN output (printed)", "from weights it does not state",
                 [[0.45, 0.32, 0.21, 0.56], [0.38, 0.41, 0.18, 0.49]], SRC)
    text_normed = tensor([[-0.71, -0.61, -1.15, 0.88], [-0.23, 0.10, -1.40, 0.55]])
    out = r.step("text's encoder output", "LayerNorm(text's X'_norm + text's FFN output)",
                 layer_norm_rows(text_normed + ffn), SRC)
    printed = "[[-0.52, -0.43, -0.89, 0.72], [-0.31, 0.28, -1.02, 0.61]]"
    r.compare("text's encoder output", printed, out, why=WHY_NORM.format(
        sums=_row_sums(printed)))


def _row_sums(text: str) -> str:
    import ast

    return " and ".join(f"{sum(row):+.2f}" for row in ast.literal_eval(text))


def _decoder(r: ExampleResult, w: dict[str, Tensor], memory: Tensor) -> None:
    y = r.step("Y", "E[<S>] + PE[0]: the text's start embedding [0.1, 0.2, 0.3, 0.4] plus "
               "position 0", tensor([[0.1, 0.2, 0.3, 0.4]]) + tensor([[0.0, 1.0, 0.0, 1.0]]),
               ["<S>"])
    q, k, v = y @ w["dec W^Q"], y @ w["dec W^K"], y @ w["dec W^V"]
    self_a = r.step("masked self-attention weights", "one token: it sees only itself",
                    softmax_rows(q @ k.T / math.sqrt(2)), ["<S>"], ["<S>"])
    y1 = r.step("Y'", "LayerNorm(Y + A·V·W^O)", layer_norm_rows(y + self_a @ v @ w["dec W^O"]),
                ["<S>"])
    cq = r.step("cross Q", "Y'·W^Q (queries from the decoder)", y1 @ w["cross W^Q"], ["<S>"])
    ck = r.step("cross K", "memory·W^K (keys from the encoder)", memory @ w["cross W^K"], SRC)
    cv = r.step("cross V", "memory·W^V (values from the encoder)", memory @ w["cross W^V"], SRC)
    alpha = r.step("cross-attention weights", "softmax(cross Q·cross Kᵀ/√2): <S> over the "
                   "source", softmax_rows(cq @ ck.T / math.sqrt(2)), ["<S>"], SRC)
    y2 = r.step("Y''", "LayerNorm(Y' + α·cross V·W^O)",
                layer_norm_rows(y1 + alpha @ cv @ w["cross W^O"]), ["<S>"])
    h = r.step("h", "LayerNorm(Y'' + FFN(Y''))", layer_norm_rows(y2 + _ffn(y2, w, "dec ")),
               ["<S>"])
    logits = r.step("logits", "h·W_U", h @ w["W_U"], ["<S>"], VOCAB)
    p = r.step("probabilities", "softmax(logits)", softmax_rows(logits), ["<S>"], VOCAB)
    r.note(f"with these random weights the first token is {VOCAB[int(p.argmax())]!r} "
           f"(p = {float(p.max()):.3f}); the text's p(\"Je\") = 0.85 and its cross-attention "
           "[0.45, 0.55] come from trained weights it does not give, so they cannot be "
           "recomputed")
    layer = _decoder_layer(w)
    with torch.no_grad():
        own = layer(y[None], memory[None], need_weights=True)[0]
    r.check("h vs attnlab.nn.DecoderLayer (causal, post-LN) with these weights", diff(h, own),
            1e-12)
    r.check("cross-attention weights vs DecoderLayer's", diff(alpha, layer.cross_weights),
            1e-12)
    r.check("probabilities vs torch.softmax", diff(p, torch.softmax(logits, -1)), 1e-12)


def _ffn(x: Tensor, w: dict[str, Tensor], side: str) -> Tensor:
    return torch.relu(x @ w[f"{side}W₁"] + w[f"{side}b₁"]) @ w[f"{side}W₂"] + w[f"{side}b₂"]


def _config() -> ModelConfig:
    return ModelConfig(vocab_size=len(VOCAB), d_model=4, n_heads=1, head_dim=2, d_ff=8,
                       n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)


def _load_attention(mha, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor) -> None:
    for proj, m in ((mha.q_proj, wq), (mha.k_proj, wk), (mha.v_proj, wv), (mha.out_proj, wo)):
        proj.weight.copy_(m.T)  # nn.Linear keeps (out, in): x·W is x·weightᵀ
        proj.bias.zero_()


def _load_ffn(ffn, w: dict[str, Tensor], side: str) -> None:
    ffn.w1.weight.copy_(w[f"{side}W₁"].T)
    ffn.w1.bias.copy_(w[f"{side}b₁"])
    ffn.w2.weight.copy_(w[f"{side}W₂"].T)
    ffn.w2.bias.copy_(w[f"{side}b₂"])


def _encoder_layer(w: dict[str, Tensor]) -> EncoderLayer:
    layer = EncoderLayer(_config()).double().eval()
    with torch.no_grad():
        _load_attention(layer.self_attn, w["W^Q"], w["W^K"], w["W^V"], w["W^O"])
        _load_ffn(layer.ffn, w, "")
    return layer


def _decoder_layer(w: dict[str, Tensor]) -> DecoderLayer:
    layer = DecoderLayer(_config()).double().eval()
    with torch.no_grad():
        _load_attention(layer.self_attn, *(w[f"dec W^{n}"] for n in "QKVO"))
        _load_attention(layer.cross_attn, *(w[f"cross W^{n}"] for n in "QKVO"))
        _load_ffn(layer.ffn, w, "dec ")
    return layer
