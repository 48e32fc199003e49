"""Finite differences as the reference for gradients.

Along a random direction u, the directional derivative ∇L·u from autograd must equal the
central difference (L(θ + εu) − L(θ − εu)) / 2ε, whose error is O(ε²) truncation plus
rounding of about 1e-16/ε in float64."""

from __future__ import annotations

from collections.abc import Callable

import torch


def directional_derivatives(loss: Callable[[], torch.Tensor], params: list[torch.Tensor],
                            eps: float = 1e-6) -> tuple[float, float]:
    """``(analytic, numeric)`` derivatives of ``loss()`` along one random direction of
    ``params`` (float64 tensors; they are restored afterwards up to rounding)."""
    directions = [torch.randn_like(p) for p in params]
    grads = torch.autograd.grad(loss(), params)
    analytic = sum((g * u).sum() for g, u in zip(grads, directions, strict=True))
    with torch.no_grad():
        for p, u in zip(params, directions, strict=True):
            p.add_(eps * u)
        plus = loss()
        for p, u in zip(params, directions, strict=True):
            p.sub_(2 * eps * u)
        minus = loss()
        for p, u in zip(params, directions, strict=True):
            p.add_(eps * u)
    return float(analytic), float((plus - minus) / (2 * eps))
