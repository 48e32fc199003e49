"""One attention head in numpy, forward and backward, written out (no autograd).

Forward, for ``Q (n, d_k)``, ``K (m, d_k)``, ``V (m, d_v)`` and a boolean ``mask (n, m)``:

    S = Q·Kᵀ / √d_k            scores
    P = softmax_row(S)         masked entries get exactly 0
    O = P·V                    output (n, d_v)

Backward, given dO = ∂L/∂O:

    dV = Pᵀ·dO
    dP = dO·Vᵀ
    dS = P ⊙ (dP − rowsum(dP ⊙ P))      the softmax Jacobian, row by row:
                                          ∂P_ij/∂S_ik = P_ij (δ_jk − P_ik)
    dQ = dS·K / √d_k
    dK = dSᵀ·Q / √d_k

Masked entries have P = 0, so they pass no gradient, as in attnlab's attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class HeadForward:
    scores: np.ndarray  # S (n, m), scaled
    weights: np.ndarray  # P (n, m)
    output: np.ndarray  # O (n, d_v)


def head_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                 mask: np.ndarray | None = None) -> HeadForward:
    s = q @ k.T / np.sqrt(q.shape[-1])
    masked = s if mask is None else np.where(mask, s, -np.inf)
    row_max = masked.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # a fully masked row
    e = np.exp(masked - row_max)  # exp(-inf) = 0 exactly
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return HeadForward(s, p, p @ v)


def head_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, fwd: HeadForward,
                  d_out: np.ndarray) -> dict[str, np.ndarray]:
    """``{"dQ", "dK", "dV", "dP", "dS"}`` from ``d_out = ∂L/∂O``."""
    p = fwd.weights
    d_v = p.T @ d_out
    d_p = d_out @ v.T
    d_s = p * (d_p - (d_p * p).sum(axis=-1, keepdims=True))
    scale = 1.0 / np.sqrt(q.shape[-1])
    return {"dQ": d_s @ k * scale, "dK": d_s.T @ q * scale, "dV": d_v, "dP": d_p, "dS": d_s}
