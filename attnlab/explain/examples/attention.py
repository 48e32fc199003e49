"""Attention worked by hand in the course texts: the guide's "The cat sat" step by step and
its "Example 1", the BERT/GPT text's query of "it", and the network text's causal row.

Each recomputes ``softmax(Q·Kᵀ/√d_k)·V`` from the numbers the text states and checks the
result against attnlab's own attention (:func:`attnlab.nn.scaled_dot_product_attention`,
:class:`attnlab.nn.MultiHeadAttention`).
"""

from __future__ import annotations

import math

import torch

from attnlab.explain.examples.base import ExampleResult, diff, softmax_rows, tensor
from attnlab.nn import MultiHeadAttention, causal_mask, scaled_dot_product_attention


def guide_self_attention(r: ExampleResult) -> None:
    """Guide, "Self-Attention in Detail": q₁ = x₁·W^Q, then q₁ against three stated keys."""
    x1 = r.step("x₁ (given, \"The\")", "the text's embedding", [0.2, 0.5, 0.1, 0.3])
    w_q = r.step("W^Q (given)", "d = 4 → d_k = 3",
                 [[0.2, 0.3, 0.1], [0.4, 0.2, 0.5], [0.1, 0.6, 0.3], [0.3, 0.1, 0.4]])
    q1 = r.step("q₁ = x₁·W^Q", "the query of \"The\"", x1 @ w_q)
    r.compare("q₁ = x₁·W^Q", "[0.31, 0.33, 0.29]", q1,
              why="the text's q₁ is not x₁·W^Q: column 1 is 0.2·0.2 + 0.5·0.4 + 0.1·0.1 + "
                  "0.3·0.3 = 0.34; its later steps use its printed q₁, and so does this "
                  "example from here on")
    q1 = r.step("q₁ (as the text prints it)", "used from here on", [0.31, 0.33, 0.29])
    keys = r.step("k₁, k₂, k₃ (given)", "the text states the keys, not W^K",
                  [[0.25, 0.35, 0.22], [0.42, 0.18, 0.31], [0.33, 0.28, 0.19]], TOKENS_3)
    scores = r.step("q₁·kⱼ", "dot products", keys @ q1, cols=TOKENS_3)
    r.compare("q₁·kⱼ", "[0.257, 0.280, 0.250]", scores)
    scaled = r.step("q₁·kⱼ / √3", "√d_k = √3 ≈ 1.732", scores / math.sqrt(3), cols=TOKENS_3)
    r.compare("q₁·kⱼ / √3", "[0.148, 0.162, 0.144]", scaled,
              why="the text divides its rounded score 0.280 (really 0.2795) by √3: "
                  "0.280/1.732 = 0.1617; 0.2795/1.732 = 0.1614")
    e = r.step("exp", "e^{score}", torch.exp(scaled), cols=TOKENS_3)
    r.compare("exp", "[1.160, 1.176, 1.155]", e,
              why="follows from the scaled score 0.162 above (e^0.162 = 1.1759; "
                  "e^0.1614 = 1.1751)")
    total = r.step("Σ exp", "the softmax's denominator", e.sum())
    r.compare("Σ exp", "3.491", total, why="the sum of the text's three exponentials, one "
              "of which is off (above)")
    w = r.step("weights", "exp / Σ exp", e / e.sum(), cols=TOKENS_3)
    r.compare("weights", "[0.332, 0.337, 0.331]", w)
    values = r.step("v₁, v₂, v₃ (given)", "the text states the values", [
        [0.3, 0.4, 0.2], [0.5, 0.2, 0.6], [0.4, 0.5, 0.3]], TOKENS_3)
    out = r.step("output₁", "Σⱼ weightⱼ·vⱼ", w @ values)
    r.compare("output₁", "[0.401, 0.366, 0.367]", out,
              why="the text adds its partial products rounded to 3 decimals "
                  "(0.100 + 0.169 + 0.132 = 0.401, 0.066 + 0.202 + 0.099 = 0.367); "
                  "unrounded they sum to 0.4004 and 0.3678")
    sdpa = scaled_dot_product_attention(q1[None], keys, values, need_weights=True)
    r.check("weights vs attnlab.nn.scaled_dot_product_attention", diff(w, sdpa[1]), 1e-12)
    r.check("output₁ vs attnlab.nn.scaled_dot_product_attention", diff(out, sdpa[0]), 1e-12)


TOKENS_3 = ["The", "cat", "sat"]


def guide_example_1(r: ExampleResult) -> None:
    """Guide, "Example 1": three words, identity W^Q = W^K = W^V, so Q = K = V = X."""
    x = r.step("X (given)", "Q = K = V = X (identity weights)",
               [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], TOKENS_3)
    raw = r.step("Q·Kᵀ", "X·Xᵀ", x @ x.T, TOKENS_3, TOKENS_3)
    r.compare("Q·Kᵀ", "[[2, 0, 2], [0, 8, 4], [2, 4, 4]]", raw)
    s = r.step("scaled", "Q·Kᵀ / √4", raw / 2, TOKENS_3, TOKENS_3)
    r.compare("scaled", "[[1.0, 0.0, 1.0], [0.0, 4.0, 2.0], [1.0, 2.0, 2.0]]", s)
    e = r.step("exp", "e^{scaled}", torch.exp(s), TOKENS_3, TOKENS_3)
    r.compare("exp", "[[2.718, 1.0, 2.718], [1.0, 54.6, 7.39], [2.718, 7.39, 7.39]]", e)
    a = r.step("A", "softmax over each row", softmax_rows(s), TOKENS_3, TOKENS_3)
    r.compare("A", "[[0.42, 0.16, 0.42], [0.02, 0.87, 0.11], [0.16, 0.42, 0.42]]", a,
              why="row \"cat\": 7.389/62.99 = 0.1173 rounds to 0.12; the text prints 0.11, "
                  "probably so that the row's rounded weights sum to 1.00 (0.02 + 0.87 + 0.12 "
                  "= 1.01)")
    out = r.step("output", "A·V", a @ x, TOKENS_3)
    r.compare("output", "[[0.84, 0.74, 0.84, 0.74], [0.13, 1.85, 0.13, 1.85], "
              "[0.58, 1.26, 0.58, 1.26]]", out,
              why="the text multiplies its 2-decimal weights (0.16·2 + 0.42 = 0.74, "
                  "0.42·2 + 0.42 = 1.26); the unrounded weights give 0.7331 and 1.2669")
    sdpa = scaled_dot_product_attention(x, x, x, need_weights=True)
    r.check("A vs attnlab.nn.scaled_dot_product_attention", diff(a, sdpa[1]), 1e-12)
    mha = _identity_attention(4)
    with torch.no_grad():
        got, weights = mha(x[None], need_weights=True)
    r.check("output vs attnlab.nn.MultiHeadAttention (1 head, identity W^Q, W^K, W^V, W^O)",
            diff(out, got[0]), 1e-12)
    r.check("A vs MultiHeadAttention's weights", diff(a, weights[0, 0]), 1e-12)


def _identity_attention(d: int) -> MultiHeadAttention:
    mha = MultiHeadAttention(d, 1, bias=False).double()
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj):
            proj.weight.copy_(torch.eye(d))
    return mha


TOKENS_IT = ["cat", "sat", "mat", "it"]


def it_attention(r: ExampleResult) -> None:
    """BERT/GPT text, "Understanding Attention Scores": the query of "it" against four keys."""
    q = r.step("Q_it (given)", "what \"it\" looks for", [0.2, 0.5, 0.1])
    keys = r.step("K (given)", "K_cat, K_sat, K_mat; K_it = Q_it, as the text's "
                  "\"it and itself\" product uses", [[0.3, 0.2, 0.1], [0.1, 0.3, 0.2],
                                                   [0.2, 0.6, 0.1], [0.2, 0.5, 0.1]], TOKENS_IT)
    scores = r.step("scores", "Q_it·K_j", keys @ q, cols=TOKENS_IT)
    r.compare("scores", "[0.17, 0.19, 0.35, 0.30]", scores)
    scaled = r.step("scaled", "scores / √3", scores / math.sqrt(3), cols=TOKENS_IT)
    r.compare("scaled", "[0.10, 0.11, 0.20, 0.17]", scaled)
    w = r.step("weights", "softmax(scaled)", softmax_rows(scaled), cols=TOKENS_IT)
    r.compare("weights", "[0.22, 0.23, 0.31, 0.24]", w,
              why="not a softmax of the scaled scores: these lie within 0.11 of each other, "
                  "so no weight can exceed another by more than e^0.11 = 1.11 times "
                  "(the text has 0.31/0.22 = 1.41); \"mat\" still gets the most, 0.26")
    values = r.step("V (given)", "V_cat, V_sat, V_mat, V_it", [
        [0.7, 0.2, 0.1], [0.4, 0.5, 0.1], [0.1, 0.8, 0.1], [0.3, 0.4, 0.3]], TOKENS_IT)
    out = r.step("output", "Σ_j weight_j·V_j", w @ values)
    r.compare("output", "[0.349, 0.503, 0.148]", out,
              why="follows from the text's weights, which are wrong (above)")
    text_w = r.step("output from the text's own weights", "[0.22, 0.23, 0.31, 0.24]·V",
                    tensor([0.22, 0.23, 0.31, 0.24]) @ values)
    r.compare("output from the text's own weights", "[0.349, 0.503, 0.148]", text_w)
    sdpa = scaled_dot_product_attention(q[None], keys, values, need_weights=True)
    r.check("weights vs attnlab.nn.scaled_dot_product_attention", diff(w, sdpa[1]), 1e-12)
    r.check("output vs attnlab.nn.scaled_dot_product_attention", diff(out, sdpa[0]), 1e-12)


TOKENS_FR = ["<S>", "Je", "t'", "aime"]


def causal_row(r: ExampleResult) -> None:
    """Network text, "Causal Mask Visualization": the decoder's scores, masked, softmaxed."""
    s = r.step("scores (given)", "Q·Kᵀ/√d_k as the text states them", [
        [1.2, 0.5, 0.3, 0.1], [0.8, 2.1, 1.5, 0.9], [0.4, 1.3, 1.8, 1.2],
        [0.2, 0.7, 1.1, 2.0]], TOKENS_FR, TOKENS_FR)
    allowed = causal_mask(4)[0, 0]
    r.step("mask", "True (1) where key j ≤ query i: attnlab.nn.causal_mask",
           allowed.long(), TOKENS_FR, TOKENS_FR)
    masked = r.step("masked scores", "score where allowed, −∞ above the diagonal",
                    s.masked_fill(~allowed, float("-inf")), TOKENS_FR, TOKENS_FR)
    a = r.step("A", "softmax over each row (e^−∞ = 0)", softmax_rows(masked),
               TOKENS_FR, TOKENS_FR)
    r.compare("A", "[[1.00, 0.00, 0.00, 0.00], [0.21, 0.79, 0.00, 0.00], "
              "[0.11, 0.27, 0.62, 0.00], [0.06, 0.10, 0.17, 0.67]]", a,
              why="rows t' and aime are not the softmax of the text's scores: softmax([0.4, "
                  "1.3, 1.8]) = [0.13, 0.33, 0.54]; the printed rows are sharper, and the "
                  "text does not say how it got them")
    # The same rows from attnlab's attention: queries = the scores, keys = 2·I (d_k = 4, so
    # Q·Kᵀ/√4 = S), values = I (so the output is A itself).
    eye = torch.eye(4, dtype=torch.float64)
    _, weights = scaled_dot_product_attention(s[None, None], 2 * eye[None, None], eye[None, None],
                                              is_causal=True, need_weights=True)
    r.check("A vs attnlab.nn.scaled_dot_product_attention(is_causal=True)",
            diff(a, weights[0, 0]), 1e-12)
    r.check("masked weights are exactly 0", float(a[~allowed].abs().max()), 0.0)
    r.check("each row sums to 1", diff(a.sum(-1), torch.ones(4)), 1e-12)
