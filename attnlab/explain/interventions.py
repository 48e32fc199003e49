"""Interventions on attention heads (``explain --ablate``, ``--patch-from``), through
:func:`attnlab.explain.hooks.patched` on the heads' outputs before W_O.

**Ablation** sets ``head_h`` to zero in ``Concat(head_1 … head_H) · W_O``: the layer goes on
without that head's contribution. It equals removing the head (its rows of W_Q, W_K, W_V and
its columns of W_O), which :func:`attnlab.compression.prune.remove_heads` does, and the check
compares the two.

**Activation patching** runs a second input of the same length, and puts one head's output
(all positions) from that run into the main run at a time. With ``a`` and ``b`` the two runs'
top tokens at the last read position (where both predict ``a``, ``b`` is the other run's
runner-up) and ``D = logit_b − logit_a`` there,

    effect(l, h) = (D_patched(l, h) − D_main) / (D_other − D_main)

is 0 where the head carries nothing of the difference and 1 where that one head turns the main
run's logit difference into the other's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.explain.hooks import ATTENTIONS, patched, replace_head, stacks, trace
from attnlab.explain.lens import grid
from attnlab.explain.probe import Probe
from attnlab.explain.tables import label
from attnlab.explain.walkthrough import Check

TOL = 1e-6  # ablated against pruned: the same sums, one with zeros in them
PREFIXES = {"encoder": ("encoder", "self_attn"), "decoder": ("decoder", "self_attn"),
            "cross": ("decoder", "cross_attn")}


@dataclass(frozen=True)
class HeadRef:
    stack: str
    attention: str  # "self_attn" or "cross_attn"
    layer: int
    head: int
    text: str  # as the user wrote it

    @property
    def stage(self) -> str:
        return f"{self.stack}.{self.layer}.{self.attention}.heads"


def parse_heads(spec: str, probe: Probe, flag: str = "--ablate") -> list[HeadRef]:
    """``L.H[,L.H…]`` (the probe's stack's self-attention; an encoder–decoder also takes
    ``encoder.L.H``, ``decoder.L.H`` and ``cross.L.H``) -> the heads, each checked to exist."""
    found = stacks(probe.model)
    heads = []
    for text in (t.strip() for t in spec.split(",")):
        prefix, _, rest = text.rpartition(".")
        where, _, layer_text = prefix.rpartition(".")
        stack, attention = PREFIXES.get(where, (probe.stack, "self_attn"))
        if (where and where not in PREFIXES) or not (layer_text.isdigit() and rest.isdigit()):
            raise BadInput(f"{flag} {text!r}: give heads as L.H (layer.head), e.g. 0.1"
                           + (", or encoder.L.H, decoder.L.H, cross.L.H" if len(found) > 1
                              else ""))
        if stack not in found:
            raise BadInput(f"{flag} {text}: the model has no {stack}")
        layers = found[stack]
        layer, head = int(layer_text), int(rest)
        if layer >= len(layers):
            owner = f"the {stack}" if len(found) > 1 else "the model"
            raise BadInput(f"{flag} {text}: no layer {layer}; {owner} has {len(layers)} "
                           f"layers (0-{len(layers) - 1})")
        module = getattr(layers[layer], attention, None)
        if module is None:
            raise BadInput(f"{flag} {text}: the {stack}'s layers have no {attention}")
        if head >= module.n_heads:
            raise BadInput(f"{flag} {text}: no head {head}; layer {layer} has "
                           f"{module.n_heads} heads (0-{module.n_heads - 1})")
        heads.append(HeadRef(stack, attention, layer, head, text))
    return heads


def zero_heads(heads: list[HeadRef]) -> dict:
    """The patches that ablate ``heads``: ``{stage: fn}``, a stage's listed heads set to 0."""
    by_stage: dict[str, list[int]] = {}
    for ref in heads:
        by_stage.setdefault(ref.stage, []).append(ref.head)

    def zero(chosen: list[int]):
        def patch(value: Tensor) -> Tensor:
            new = value.clone()
            new[..., chosen, :] = 0
            return new

        return patch

    return {stage: zero(chosen) for stage, chosen in by_stage.items()}


@dataclass
class Ablation:
    heads: list[HeadRef]
    before: Tensor  # the model's scores at the read positions, (read, vocab)
    after: Tensor  # the same with the heads ablated
    chosen: int  # the model's own pick at the last read position
    check: Check | None  # against the pruned copy; None where pruning does not apply
    note: str = ""  # why there is no check


def ablate(probe: Probe, heads: list[HeadRef]) -> Ablation:
    """The probe's scores without ``heads`` (module docstring), and the pruning check."""
    before = probe.forward()
    with patched(probe.model, zero_heads(heads)):
        after = probe.forward()
    check, note = pruned_check(probe, heads, after)
    from attnlab.explain.output import usable

    chosen = int(usable(before[-1], probe.model).argmax())  # never an encoder–decoder's <pad>
    return Ablation(heads, before, after, chosen, check, note)


def attention_path(model: nn.Module, ref: HeadRef) -> str:
    """The module path of ``ref``'s attention, as :mod:`attnlab.compression.prune` names it."""
    module = getattr(stacks(model)[ref.stack][ref.layer], ref.attention)
    return next(name for name, m in model.named_modules() if m is module)


def pruned_check(probe: Probe, heads: list[HeadRef], after: Tensor) -> tuple[Check | None, str]:
    """Ablated scores against a copy of the model with the heads removed by
    :func:`~attnlab.compression.prune.remove_heads`, where it can remove them."""
    from attnlab.compression.prune import remove_heads

    model = probe.model
    if getattr(model.config, "share_layers", False):
        return None, "no pruning check: the layers are shared (ALBERT)"
    drop: dict[str, list[int]] = {}
    for ref in heads:
        drop.setdefault(attention_path(model, ref), []).append(ref.head)
    for path, chosen in drop.items():
        attention = model.get_submodule(path)
        if attention.num_kv_heads != attention.n_heads:
            return None, "no pruning check: pruning needs one key/value head per query head"
        if len(set(chosen)) >= attention.n_heads:
            return None, "no pruning check: pruning keeps at least one head a layer"
        if type(attention.out_proj) is not nn.Linear:
            return None, "no pruning check: pruning copies plain float linear layers"
    pruned = copy.deepcopy(model)
    remove_heads(pruned, {p: sorted(set(c)) for p, c in drop.items()})
    error = float((probe.forward(pruned) - after).abs().max())
    return Check("ablated = the heads removed (compression/prune.py)", error, TOL), ""


# --- activation patching ---------------------------------------------------------------------
@dataclass
class Patching:
    rows: list[str]  # each attention: "0", "1" (one stack) or "encoder.0", "cross.1", …
    effect: Tensor  # (attentions, max heads); NaN where a layer has fewer heads
    main_token: int  # a: the main run's top token at the last read position
    other_token: int  # b: the other run's (its runner-up where both runs predict a)
    main_diff: float  # D_main = logit_b − logit_a in the main run
    other_diff: float  # D_other
    same_top: bool = False  # both runs predict a: b is the other run's second


def check_same_length(main: Probe, other: Probe, flag: str = "--patch-from") -> None:
    """Patching copies every position: both inputs need the same token count."""
    for what, a, b in (("tokens", main.tokens, other.tokens),
                       ("source tokens", main.source, other.source)):
        if a is not None and len(a) != len(b):
            raise BadInput(f"{flag}: the other sentence has {len(b)} {what}, the main one "
                           f"{len(a)}; patching needs the same count")


def _row(stack: str, layer: int, attention: str, several: bool) -> str:
    if attention == "cross_attn":
        return f"cross.{layer}"
    return f"{stack}.{layer}" if several else str(layer)


def attentions(model: nn.Module) -> list[tuple[str, int, str]]:
    """Every attention of ``model`` as ``(stack, layer, "self_attn" | "cross_attn")``, in the
    order the forward pass runs them."""
    return [(s, i, a) for s, layers in stacks(model).items() for i, layer in enumerate(layers)
            for a in ATTENTIONS if getattr(layer, a, None) is not None]


@dataclass
class EachAblated:
    rows: list[str]  # each attention, named as in Patching.rows
    probs: Tensor  # p(chosen) with that one head ablated, (attentions, max heads); NaN: no head
    before: float  # p(chosen) unablated
    chosen: int  # the model's own pick at the last read position


def ablate_each(probe: Probe) -> EachAblated:
    """Every head ablated alone (:func:`zero_heads`, one head at a time): the probability of the
    model's own greedy pick at the last read position, ``softmax(scores_without_h)[chosen]``,
    over the scores a token may be chosen from (:func:`~attnlab.explain.output.usable`: an
    encoder–decoder never outputs padding), as the output stage reads them."""
    from attnlab.explain.output import usable

    def probs() -> Tensor:
        return usable(probe.forward()[-1].float(), probe.model).softmax(-1)

    found = stacks(probe.model)
    stages = attentions(probe.model)
    before = probs()
    chosen = int(before.argmax())
    width = max(getattr(found[s][i], a).n_heads for s, i, a in stages)
    after = torch.full((len(stages), width), float("nan"))
    rows = [_row(s, i, a, len(found) > 1) for s, i, a in stages]
    for r, (s, i, a) in enumerate(stages):
        for h in range(getattr(found[s][i], a).n_heads):
            with patched(probe.model, zero_heads([HeadRef(s, a, i, h, f"{rows[r]}.{h}")])):
                after[r, h] = probs()[chosen]
    return EachAblated(rows, after, float(before[chosen]), chosen)


def patch_from(main: Probe, other: Probe) -> Patching:
    """Each head's output from ``other``'s run put into ``main``'s, one head at a time
    (module docstring)."""
    check_same_length(main, other)
    found = stacks(main.model)
    stages = attentions(main.model)
    theirs = trace(other.model, stages=[f"{s}.{i}.{a}.heads" for s, i, a in stages],
                   forward=other.forward)
    from attnlab.explain.output import usable

    base = main.forward()[-1]  # the tokens are ranked as the output stage ranks them
    a = int(usable(base, main.model).argmax())
    ranked = usable(theirs.output[-1], main.model).topk(2).indices.tolist()
    same_top = ranked[0] == a  # then the contrast is with the other run's runner-up
    b = ranked[1] if same_top else ranked[0]
    d_main = float(base[b] - base[a])
    d_other = float(theirs.output[-1][b] - theirs.output[-1][a])
    if abs(d_other - d_main) < 1e-6:
        raise BadInput(f"--patch-from: the two sentences give the same logit difference "
                       f"between {main.token_text(b)!r} and {main.token_text(a)!r} at the last "
                       "position: there is no difference for a head to carry")
    width = max(getattr(found[s][i], at).n_heads for s, i, at in stages)
    effect = torch.full((len(stages), width), float("nan"))
    for r, (s, i, at) in enumerate(stages):
        stage = f"{s}.{i}.{at}.heads"
        for h in range(getattr(found[s][i], at).n_heads):
            with patched(main.model, {stage: replace_head(h, theirs[stage])}):
                out = main.forward()[-1]
            effect[r, h] = (float(out[b] - out[a]) - d_main) / (d_other - d_main)
    rows = [_row(s, i, at, len(found) > 1) for s, i, at in stages]
    return Patching(rows, effect, a, b, d_main, d_other, same_top)


# --- text ------------------------------------------------------------------------------------
def ablation_table(probe: Probe, ablation: Ablation, k: int = 5) -> dict:
    """The numbers ``--ablate`` prints: p(the chosen token) before and after, and the top
    ``k`` tokens before and after, over the scores a token may be chosen from
    (:func:`~attnlab.explain.output.usable`: an encoder–decoder never outputs padding)."""
    from attnlab.explain.output import usable

    p0, p1 = (usable(s[-1].float(), probe.model).softmax(-1)
              for s in (ablation.before, ablation.after))
    c = ablation.chosen
    t0, t1 = p0.topk(min(k, len(p0))), p1.topk(min(k, len(p1)))
    return {"where": probe.tokens[probe.last], "chosen": probe.token_text(c),
            "p_before": float(p0[c]), "p_after": float(p1[c]),
            "before": [[probe.token_text(int(i)), float(p)] for p, i in zip(*t0, strict=True)],
            "after": [[probe.token_text(int(i)), float(p)] for p, i in zip(*t1, strict=True)]}


def format_ablation(probe: Probe, ablation: Ablation, k: int = 5) -> str:
    t = ablation_table(probe, ablation, k)
    p0, p1 = t["p_before"], t["p_after"]
    lines = [f"ablated: head{'s' if len(ablation.heads) > 1 else ''} "
             f"{', '.join(h.text for h in ablation.heads)} (output before W_O set to zero)",
             f"the chosen token at the last position ({label(t['where'])}): "
             f"{label(t['chosen'])}   p = {p0:.4f} → {p1:.4f} ({p1 - p0:+.4f})",
             f"  {'':>3} {'before':<24} after"]
    for r, ((a, pa), (b, pb)) in enumerate(zip(t["before"], t["after"], strict=True)):
        left = f"{label(a)} {pa:.4f}"
        lines.append(f"  {r + 1:>3} {left:<24} {label(b)} {pb:.4f}")
    if ablation.check is not None:
        ch = ablation.check
        lines.append(f"check  {ch.name}: max |Δ logits| = {ch.error:.2e} (tol {ch.tol:.0e}) "
                     f"{'ok' if ch.ok else 'FAILED'}")
    else:
        lines.append(ablation.note)
    return "\n".join(lines)


def format_patching(probe: Probe, patching: Patching) -> str:
    text = lambda i: label(probe.token_text(int(i)))  # noqa: E731
    a, b = text(patching.main_token), text(patching.other_token)
    cells = [["·" if torch.isnan(x) else f"{float(x):+.2f}" for x in row]
             for row in patching.effect]
    return "\n".join([
        f"activation patching: one head's output (before W_O, all positions) from the other "
        f"run at a time; D = logit({b}) − logit({a}) at the last position"
        + (f" (both runs predict {a}: {b} is the other run's runner-up)"
           if patching.same_top else ""),
        f"  D_main = {patching.main_diff:+.4f}, D_other = {patching.other_diff:+.4f}; "
        "effect = (D_patched − D_main) / (D_other − D_main), layer × head:",
        grid(cells, patching.rows, [f"h{h}" for h in range(patching.effect.shape[1])])])




# --- the identity patch, and what explain prints -------------------------------------------
def identity_check(probe: Probe) -> Check:
    """Every stage recorded, then put back in place of itself, one kind at a time (``in``,
    ``self_attn.heads``, …: a later stage put back would hide a change to an earlier one): the
    output must be the recorded run's, bit for bit."""
    run = trace(probe.model, forward=probe.forward)
    kinds: dict[str, dict] = {}
    for name in run:
        kinds.setdefault(name.split(".", 2)[2], {})[name] = lambda v, name=name: run[name].clone()
    error = 0.0
    for patches in kinds.values():
        with patched(probe.model, patches):
            error = max(error, float((probe.forward() - run.output).abs().max()))
    return Check("every stage recorded and put back: the output bit for bit", error, 0.0)


def probe_report(probe: Probe, lens: bool = False, heads: list[HeadRef] | None = None,
                 other: Probe | None = None, all_layers: bool = False) -> tuple[str, list[Check]]:
    """The text of ``explain --lens / --all-layers / --ablate / --patch-from`` and its checks."""
    from attnlab.explain.lens import format_lens, format_stream, logit_lens, residual_stream

    parts, checks = [], []
    if lens:
        seen = logit_lens(probe)
        parts.append(format_lens(seen))
        checks.append(seen.check)
    if all_layers:
        parts.append(format_stream(probe, residual_stream(probe)))
    if heads or other is not None:
        same = identity_check(probe)
        checks.append(same)
        parts.append(f"check  {same.name}: max |Δ| = {same.error:.2e} "
                     f"{'ok' if same.ok else 'FAILED'}")
    if heads:
        done = ablate(probe, heads)
        parts.append(format_ablation(probe, done))
        checks += [done.check] if done.check is not None else []
    if other is not None:
        parts.append(format_patching(probe, patch_from(probe, other)))
    return "\n\n".join(parts), checks


__all__ = ["Ablation", "EachAblated", "HeadRef", "Patching", "ablate", "ablate_each",
           "ablation_table", "attentions", "check_same_length", "format_ablation",
           "format_patching", "identity_check", "parse_heads", "patch_from", "probe_report",
           "pruned_check", "zero_heads"]
