"""The walkthrough as text (the terminal) — values truncated to a few rows and columns."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from attnlab.explain.walkthrough import Walkthrough


def format_value(value, dims: int = 6, rows: int = 8) -> str:
    """A matrix shown as its first ``rows`` rows and ``dims`` columns, 4 decimals."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "  " + "  ".join(str(v) for v in value)
    a = value.detach().cpu()
    a = (a if not a.is_floating_point() else a.float()).numpy()
    if a.ndim == 1:
        a = a[None]
    lines = []
    for r in a[:rows]:
        cells = " ".join(f"{x:+.4f}" if np.issubdtype(a.dtype, np.floating) else f"{int(x):>2d}"
                         for x in r[:dims])
        lines.append(f"  [{cells}{' …' if a.shape[1] > dims else ''}]")
    if a.shape[0] > rows:
        lines.append(f"  … {a.shape[0] - rows} more rows")
    return "\n".join(lines)


def check_lines(w: Walkthrough) -> list[str]:
    return [f"  check: {c.name}: max |difference| = {c.error:.2e} "
            f"(tolerance {c.tol:.0e}) → {'OK' if c.ok else 'FAILED'}" for c in w.checks]


def format_text(w: Walkthrough, dims: int = 6, compare: dict | None = None) -> str:
    s = w.subject
    out = [f"model: {s.label}",
           s.input_line,
           f"following layer {w.layer}, head {w.head} "
           f"(d_model {s.model.config.d_model}, {s.model.config.n_heads} heads, "
           f"d_k {s.model.config.d_k}); values show the first {dims} columns", ""]
    for n, stage in enumerate(w.stages, 1):
        shape = f"  shape {stage.shape}" if stage.shape else ""
        out.append(f"{n:2d}. {stage.title}: {stage.formula}{shape}")
        if stage.note:
            out.append(f"    {stage.note}")
        body = format_value(stage.value, dims)
        if body:
            out.append(body)
    out += ["", "checks (each computed now):", *check_lines(w)]
    passed = sum(c.ok for c in w.checks)
    out.append(f"  {passed} of {len(w.checks)} checks passed")
    if compare is not None:
        out += ["", *compare_lines(compare, dims)]
    return "\n".join(out)


def compare_lines(r: dict, dims: int = 6) -> list[str]:
    word = r["word"]
    return [f"the word {word!r} in both sentences:",
            f"  static (input embedding row), sentence 1:{format_value(r['static_a'], dims)}",
            f"  static (input embedding row), sentence 2:{format_value(r['static_b'], dims)}",
            f"  cos(static, static) = {r['static_cos']:.4f}  "
            f"({'identical rows' if r['static_identical'] else 'different rows'})",
            f"  contextual (last layer output), sentence 1:"
            f"{format_value(r['contextual_a'], dims)}",
            f"  contextual (last layer output), sentence 2:"
            f"{format_value(r['contextual_b'], dims)}",
            f"  cos(contextual, contextual) = {r['contextual_cos']:.4f}"]


def format_backward(dims: int = 4, seed: int = 0) -> str:
    """A small one-head example: numpy forward/backward by the formulas vs torch autograd."""
    import torch

    from attnlab.explain.numpy_attention import head_backward, head_forward

    g = torch.Generator().manual_seed(seed)
    q, k, v, d_out = (torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(4))
    fwd = head_forward(q.numpy(), k.numpy(), v.numpy())
    grads = head_backward(q.numpy(), k.numpy(), v.numpy(), fwd, d_out.numpy())
    qt, kt, vt = (t.clone().requires_grad_() for t in (q, k, v))
    p = (qt @ kt.T / 2.0).softmax(-1)  # √d_k = 2
    (p @ vt).backward(d_out)
    autograd = {"dQ": qt.grad, "dK": kt.grad, "dV": vt.grad}

    def show(name: str, a) -> str:
        return f"{name}:\n{format_value(Tensor(np.asarray(a)), dims)}"

    out = ["one attention head, 3 queries, 3 keys, d_k = 4 (float64), L = Σ dO ⊙ O",
           show("Q", q), show("K", k), show("V", v), show("dO", d_out),
           show("P = softmax(Q·Kᵀ/√d_k)", fwd.weights),
           show("dV = Pᵀ·dO", grads["dV"]), show("dP = dO·Vᵀ", grads["dP"]),
           show("dS = P ⊙ (dP − rowsum(dP ⊙ P))", grads["dS"]),
           show("dQ = dS·K/√d_k", grads["dQ"]), show("dK = dSᵀ·Q/√d_k", grads["dK"]),
           "checks against torch autograd (computed now):"]
    for name in ("dQ", "dK", "dV"):
        err = float(np.abs(grads[name] - autograd[name].numpy()).max())
        out.append(f"  check: {name} by the formula vs autograd: max |difference| = {err:.2e} "
                   f"(tolerance 1e-06) → {'OK' if err <= 1e-6 else 'FAILED'}")
    return "\n".join(out)
