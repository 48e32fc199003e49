"""The logit lens, and the residual stream followed layer by layer (``explain --lens``,
``--all-layers``).

The logit lens (nostalgebraist, 2020) reads every layer's output as if it were the last: the
hidden state ``h_l (seq, d)`` goes through what the model applies after its last layer,
:func:`~attnlab.explain.readout.readout` (the final norm where the model has one, then W_U):

    p_l = softmax(Readout(h_l))                 (read positions, vocab),  l = emb, 0 … N−1

so ``p_{N−1}`` is the model's own prediction, and the earlier rows show when it forms. For each
layer and read position it keeps the top tokens, and the probability the layer already gives
the final prediction ``argmax p_{N−1}``.

The residual stream: layer l adds ``u_l = h_l − h_{l−1}`` to it. The head that moved it most
is the head whose own contribution through W_O, ``c_h = head_h · W_O[h] (d,)``, has the
largest projection onto the update, ``c_h · u_l / ‖u_l‖``, at the last read position. Pre-LN
layers add ``c_h`` to the stream as it is; post-LN layers normalise the sum after, so there the
projection compares directions, not exact shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.explain.hooks import ATTENTIONS, stacks, trace
from attnlab.explain.output import usable
from attnlab.explain.probe import Probe
from attnlab.explain.readout import readout
from attnlab.explain.tables import kept, label
from attnlab.explain.walkthrough import Check

TOL = 1e-5  # the last layer's lens against the model's own logits, relative to their size


@dataclass
class Lens:
    probe: Probe
    layers: list[str]  # "emb", then "0" … "N-1"
    top_ids: Tensor  # (layers, read, k)
    top_probs: Tensor  # (layers, read, k)
    final_ids: Tensor  # the model's prediction at each read position, (read,)
    final_probs: Tensor  # p_l(final prediction), (layers, read)
    parts: list[str]  # the readout's steps, in words
    check: Check  # the last layer's lens against the model's logits


def layer_states(probe: Probe, extra: list[str] | None = None):
    """The model's own pass with every layer's output (and the first layer's input, the
    embeddings) recorded: ``(trace, states (layers + 1, seq, d))``."""
    n = len(stacks(probe.model)[probe.stack])
    names = [f"{probe.stack}.0.in"] + [f"{probe.stack}.{i}.out" for i in range(n)]
    run = trace(probe.model, stages=names + (extra or []), forward=probe.forward)
    return run, torch.stack([run[name][0] for name in names])


def logit_lens(probe: Probe, k: int = 5) -> Lens:
    """Every layer's output through the readout, at the probe's read positions."""
    read = readout(probe.model)
    run, states = layer_states(probe)
    with torch.no_grad():  # a layer at a time, (1, seq, d) as the model's own head reads it
        logits = torch.stack([read(h[None])[0, probe.read] for h in states]).float()
    own = run.output.float()  # (read, vocab)
    error = float((logits[-1] - own).abs().max())
    scale = max(1.0, float(own.abs().max()))
    # read over the scores a token may be chosen from (an encoder–decoder never outputs <pad>)
    logits, own = usable(logits, probe.model), usable(own, probe.model)
    probs = logits.softmax(-1)
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    final = own.argmax(-1)
    n = states.shape[0] - 1
    return Lens(probe, ["emb"] + [str(i) for i in range(n)], top.indices, top.values, final,
                probs.gather(-1, final.expand(n + 1, -1)[..., None])[..., 0], read.parts,
                Check("the last layer's lens = the model's own logits", error,
                      TOL * scale))


@dataclass
class StreamLayer:
    layer: int
    update: float  # ‖h_l − h_{l−1}‖ at the last read position
    token: int  # the lens's top token there
    prob: float
    head: str  # the head that moved the stream most, e.g. "self 3" or "cross 1"
    push: float  # its projection onto the update, c_h · u / ‖u‖


def head_contributions(attention, heads: Tensor) -> Tensor:
    """Each head's own output through W_O: ``heads (H, d_k)`` at one position -> ``(H, d)``,
    row h = out_proj(head h alone) − out_proj(0) (the bias cancels; any linear type)."""
    n, d_k = heads.shape
    alone = heads.new_zeros(1, n, n, d_k)  # batch 1: a kernel linear takes (b, rows, in)
    alone[0, torch.arange(n), torch.arange(n)] = heads
    with torch.no_grad():
        return (attention.out_proj(alone.flatten(-2))
                - attention.out_proj(heads.new_zeros(1, 1, n * d_k)))[0]


def residual_stream(probe: Probe) -> list[StreamLayer]:
    """One :class:`StreamLayer` per layer of the probe's stack (module docstring)."""
    layers = stacks(probe.model)[probe.stack]
    wanted = [f"{probe.stack}.{i}.{a}.heads" for i, layer in enumerate(layers)
              for a in ATTENTIONS if getattr(layer, a, None) is not None]
    run, states = layer_states(probe, wanted)
    p = probe.last
    with torch.no_grad():
        probs = readout(probe.model)(states[1:, p]).float().softmax(-1)  # (layers, vocab)
    rows = []
    for i, layer in enumerate(layers):
        u = states[i + 1, p] - states[i, p]
        norm = float(u.norm())
        best = ("-", float("-inf"))
        for a in ATTENTIONS:
            name = f"{probe.stack}.{i}.{a}.heads"
            if name not in run:
                continue
            c = head_contributions(getattr(layer, a), run[name][0, p])
            push = c.float() @ u.float() / max(norm, 1e-30)
            h = int(push.argmax())
            if float(push[h]) > best[1]:
                best = (f"{a.removesuffix('_attn')} {h}", float(push[h]))
        prob, token = probs[i].max(-1)
        rows.append(StreamLayer(i, norm, int(token), float(prob), *best))
    return rows


# --- text ------------------------------------------------------------------------------------
def grid(cells: list[list[str]], rows: list[str], cols: list[str]) -> str:
    """Text cells in a table: every row (layers), the columns (tokens) cut in the middle past
    :data:`~attnlab.explain.tables.WHOLE`."""
    idx = kept(len(cols))
    heads = ["…" if j is None else label(cols[j]) for j in idx]
    body = [["…" if j is None else row[j] for j in idx] for row in cells]
    width = max(len(c) for c in heads + [c for row in body for c in row])
    row_width = max(map(len, rows))
    lines = ["  " + " " * row_width + "  " + "  ".join(c.rjust(width) for c in heads)]
    for name, row in zip(rows, body, strict=True):
        lines.append("  " + name.rjust(row_width) + "  " + "  ".join(c.rjust(width) for c in row))
    return "\n".join(lines)


def format_lens(lens: Lens) -> str:
    """The lens as text: the top token by layer and position, p(final) by layer and position,
    the top tokens at the last read position, and the check."""
    pr = lens.probe
    cols = [pr.tokens[p] for p in pr.read]
    text = lambda i: label(pr.token_text(int(i)))  # noqa: E731
    top1 = [[f"{text(lens.top_ids[layer, j, 0])} {float(lens.top_probs[layer, j, 0]):.2f}"
             for j in range(len(pr.read))] for layer in range(len(lens.layers))]
    final = [[f"{float(lens.final_probs[layer, j]):.3f}" for j in range(len(pr.read))]
             for layer in range(len(lens.layers))]
    last = [f"{lens.layers[layer]:>4}  " + "  ".join(
        f"{text(i)} {float(q):.3f}" for i, q in zip(lens.top_ids[layer, -1],
                                                     lens.top_probs[layer, -1], strict=True))
        for layer in range(len(lens.layers))]
    predicted = " ".join(text(i) for i in lens.final_ids)
    c = lens.check
    return "\n".join([
        f"logit lens: each layer's output through the readout: {' → '.join(lens.parts)}",
        f"read at: {' '.join(label(t) for t in cols)}   (the model predicts: {predicted})",
        "", "top token and its probability, layer × position:", grid(top1, lens.layers, cols),
        "", "probability of the final prediction, layer × position:",
        grid(final, lens.layers, cols),
        "", f"top {lens.top_ids.shape[-1]} at the last position ({label(cols[-1])}), by layer:",
        *last,
        "", f"check  {c.name}: max |Δ| = {c.error:.2e} (tol {c.tol:.0e}) "
            f"{'ok' if c.ok else 'FAILED'}"])


def format_stream(probe: Probe, rows: list[StreamLayer]) -> str:
    """``--all-layers``: a line per layer."""
    where = label(probe.tokens[probe.last])
    lines = [f"the residual stream at the last position ({where}), layer by layer:",
             "  ‖update‖: ‖h_l − h_(l−1)‖;  moved most: the head whose output through W_O has "
             "the largest projection c_h · u / ‖u‖ onto the update",
             f"  {'layer':>5}  {'‖update‖':>9}  {'the lens reads':<24}  moved most"]
    for r in rows:
        read = f"{label(probe.token_text(r.token))} ({r.prob:.3f})"
        lines.append(f"  {r.layer:>5}  {r.update:>9.3f}  {read:<24}  head {r.head} "
                     f"({r.push:+.3f})")
    return "\n".join(lines)


__all__ = ["Lens", "StreamLayer", "format_lens", "format_stream", "grid", "head_contributions",
           "layer_states", "logit_lens", "residual_stream"]
