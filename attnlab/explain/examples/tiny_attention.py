"""The mathematics text's tiny attention (§9.1–9.2): one head, two tokens, d_k = d_v = 3,
forward and backward.

Forward (the text's steps)::

    Q·Kᵀ → S = Q·Kᵀ/√d_k → e^S, row sums → A = softmax_row(S) → O = A·V

Backward, for the loss L = Σ dO ⊙ O with the text's dO = ∂L/∂O (the text stops at dV)::

    dV = Aᵀ·dO      dA = dO·Vᵀ      dS = A ⊙ (dA − rowsum(dA ⊙ A))
    dQ = dS·K/√d_k  dK = dSᵀ·Q/√d_k

computed by :mod:`attnlab.explain.numpy_attention`, the code ``explain --backward`` shows,
and checked against torch autograd and central finite differences.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnlab.explain.examples.base import ExampleResult, diff, tensor
from attnlab.explain.numpy_attention import head_backward, head_forward
from attnlab.nn import scaled_dot_product_attention

Q = [[1, 0, 1], [0, 1, 1]]
K = [[1, 1, 0], [1, 0, 1]]
V = [[2, 0, 1], [1, 1, 0]]
D_OUT = [[1, 0, 1], [0, 1, 0]]  # ∂L/∂O as the text gives it
TOKENS = ["t1", "t2"]
WHY_CUT = ("A₁₁ = e^0.577/(e^0.577 + e^1.155) = 0.35954, which rounds to 0.360 (and 0.64046 "
           "to 0.640); the text cuts it to 0.359")


def tiny_attention(r: ExampleResult) -> None:
    q, k, v, d_out = (tensor(m) for m in (Q, K, V, D_OUT))
    r.step("Q (given)", "the text's queries", q, TOKENS)
    r.step("K (given)", "the text's keys", k, TOKENS)
    r.step("V (given)", "the text's values", v, TOKENS)
    fwd = head_forward(q.numpy(), k.numpy(), v.numpy())

    raw = r.step("Q·Kᵀ", "every query against every key", q @ k.T, TOKENS, TOKENS)
    r.compare("Q·Kᵀ", "[[1, 2], [1, 1]]", raw)
    s = r.step("S", "Q·Kᵀ / √d_k, √3 ≈ 1.732", fwd.scores, TOKENS, TOKENS)
    r.compare("S", "[[0.577, 1.155], [0.577, 0.577]]", s)
    e = r.step("e^S", "exponentials of the scaled scores", torch.exp(s), TOKENS, TOKENS)
    r.compare("e^S", "[[1.781, 3.173], [1.781, 1.781]]", e)
    sums = r.step("row sums of e^S", "Σ_j e^{S_ij}", e.sum(-1))
    r.compare("row sums of e^S", "[4.954, 3.562]", sums,
              why="the text adds its rounded exponentials, 1.781 + 1.781 = 3.562; "
                  "2·e^0.57735 = 3.5626, which rounds to 3.563")
    a = r.step("A", "softmax over each row: e^S / row sum", fwd.weights, TOKENS, TOKENS)
    r.compare("A", "[[0.359, 0.641], [0.500, 0.500]]", a, why=WHY_CUT)
    o = r.step("O", "A·V", fwd.output, TOKENS)
    r.compare("O", "[[1.359, 0.641, 0.359], [1.500, 0.500, 0.500]]", o,
              why="follows from the cut A (above): O₁ = A₁₁·[2, 0, 1] + A₁₂·[1, 1, 0]")

    grads = head_backward(q.numpy(), k.numpy(), v.numpy(), fwd, d_out.numpy())
    r.step("dO (given)", "∂L/∂O: the loss is L = Σ dO ⊙ O", d_out, TOKENS)
    r.step("dV", "Aᵀ·dO (row j: how much key j's value moved the loss)", grads["dV"], TOKENS)
    r.compare("dV", "[[0.359, 0.500, 0.359], [0.641, 0.500, 0.641]]", grads["dV"],
              why="follows from the cut A (above): dV = Aᵀ·dO copies A's entries")
    r.step("dA", "dO·Vᵀ (the text leaves this out)", grads["dP"], TOKENS, TOKENS)
    r.step("dS", "A ⊙ (dA − rowsum(dA ⊙ A)): the softmax's Jacobian, row by row",
           grads["dS"], TOKENS, TOKENS)
    r.step("dQ", "dS·K / √d_k", grads["dQ"], TOKENS)
    r.step("dK", "dSᵀ·Q / √d_k", grads["dK"], TOKENS)
    r.note("each row of dS sums to 0: adding a constant to a row of scores leaves its softmax "
           f"unchanged (row sums: {np.round(grads['dS'].sum(-1), 12).tolist()})")

    weights_out = scaled_dot_product_attention(q, k, v, need_weights=True)
    r.check("A vs attnlab.nn.scaled_dot_product_attention", diff(a, weights_out[1]), 1e-12)
    r.check("O vs attnlab.nn.scaled_dot_product_attention", diff(o, weights_out[0]), 1e-12)
    auto = _autograd(q, k, v, d_out)
    numeric = _finite_differences(q, k, v, d_out)
    for name in ("dQ", "dK", "dV"):
        r.check(f"{name} by the formula vs torch autograd", diff(grads[name], auto[name]), 1e-12)
        r.check(f"{name} by the formula vs central finite differences",
                diff(grads[name], numeric[name]), 1e-8)
    r.check("dS vs torch autograd (through the softmax alone)",
            diff(grads["dS"], auto["dS"]), 1e-12)


def _loss(q, k, v, d_out):
    """L = Σ dO ⊙ O, whose gradient with respect to O is dO."""
    a = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return (d_out * (a @ v)).sum()


def _autograd(q, k, v, d_out) -> dict[str, torch.Tensor]:
    qt, kt, vt = (t.clone().requires_grad_() for t in (q, k, v))
    s = (qt @ kt.T / math.sqrt(q.shape[-1])).detach().requires_grad_()
    (d_out * (torch.softmax(s, dim=-1) @ v)).sum().backward()  # S as the leaf
    _loss(qt, kt, vt, d_out).backward()
    return {"dQ": qt.grad, "dK": kt.grad, "dV": vt.grad, "dS": s.grad}


def _finite_differences(q, k, v, d_out, eps: float = 1e-6) -> dict[str, torch.Tensor]:
    """(L(x + ε·e_i) − L(x − ε·e_i)) / 2ε for every entry of Q, K and V."""
    inputs = {"dQ": q, "dK": k, "dV": v}
    out = {}
    for name, x in inputs.items():
        g = torch.zeros_like(x)
        for i in np.ndindex(*x.shape):
            up, down = x.clone(), x.clone()
            up[i] += eps
            down[i] -= eps
            args_up = {**inputs, name: up}
            args_down = {**inputs, name: down}
            g[i] = (_loss(args_up["dQ"], args_up["dK"], args_up["dV"], d_out)
                    - _loss(args_down["dQ"], args_down["dK"], args_down["dV"], d_out)) / (2 * eps)
        out[name] = g
    return out
