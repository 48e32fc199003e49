"""The walkthrough as text (the terminal) — values truncated to a few rows and columns."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from attnlab.explain.tables import format_matrix
from attnlab.explain.walkthrough import Walkthrough


def format_value(value, dims: int = 6, rows: list[str] | None = None,
                 cols: list[str] | None = None) -> str:
    """A stage's value as text: a list on one line, a matrix labelled by its tokens
    (:func:`~attnlab.explain.tables.format_matrix`)."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "  " + "  ".join(str(v) for v in value)
    return format_matrix(value, rows, cols, dims)


def check_lines(w: Walkthrough) -> list[str]:
    return [f"  check: {c.name}: max |difference| = {c.error:.2e} "
            f"(tolerance {c.tol:.0e}) → {'OK' if c.ok else 'FAILED'}" for c in w.checks]


# the stages that open a part of the walk (an encoder–decoder's, the output stage): a heading
SECTIONS = {"memory": "the encoder's output",
            "decoder: target tokens": "the decoder (layer and head as above)",
            "output: hidden state": "the output stage: the next token",
            "generation, step by step": "generation continued, one token a step",
            "teacher forcing": "teacher forcing (training): the whole target in one pass"}


def format_text(w: Walkthrough, dims: int = 6, compare: dict | None = None,
                translation=None) -> str:
    """The walkthrough's stages, its checks, the word compared (``compare``) and the
    translation built (``translation``, a :class:`~attnlab.explain.seq2seq.Translation`)."""
    s = w.subject
    out = [f"model: {s.label}",
           s.input_line,
           f"following layer {w.layer}, head {w.head} "
           f"(d_model {s.model.config.d_model}, {s.model.config.n_heads} heads, "
           f"d_k {s.model.config.d_k}); values show the first {dims} columns", ""]
    for n, stage in enumerate(w.stages, 1):
        if stage.title in SECTIONS:
            out += ["", f"── {SECTIONS[stage.title]} ──"]
        shape = f"  shape {stage.shape}" if stage.shape else ""
        out.append(f"{n:2d}. {stage.title}: {stage.formula}{shape}")
        if stage.note:
            out.append(f"    {stage.note}")
        body = format_value(stage.value, dims, stage.rows, stage.cols)
        if body:
            out.append(body)
    out += ["", "checks (each computed now):", *check_lines(w)]
    passed = sum(c.ok for c in w.checks)
    out.append(f"  {passed} of {len(w.checks)} checks passed")
    if compare is not None:
        out += ["", *compare_lines(compare, dims)]
    if translation is not None:
        out += ["", *translation_lines(translation)]
    return "\n".join(out)


def translation_lines(t) -> list[str]:
    """The translation built one token a step, and translate's for the same source."""
    lines = [f"translation, built token by token: {t.text!r}"]
    if t.translate_text is not None:
        same = "the same" if t.translate_text == t.text else "DIFFERENT"
        lines.append(f"attnlab translate (greedy, fp32) gives:  {t.translate_text!r} ({same})")
    return lines


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
