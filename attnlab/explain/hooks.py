"""Record any stage of any block, and replace it: the intervention API of ``attnlab explain``.

Every stage has one name, the same in every family::

    {stack}.{i}.in                  the layer's input (the residual stream)    (batch, seq, d)
    {stack}.{i}.self_attn.heads     head_1 … head_H before W_O                 (batch, seq, H, d_k)
    {stack}.{i}.self_attn.out       Concat(heads) · W_O (+ b_O)                (batch, seq, d)
    {stack}.{i}.cross_attn.heads    the same for cross-attention (an encoder–decoder's decoder)
    {stack}.{i}.cross_attn.out
    {stack}.{i}.ffn.out             the feed-forward's output                  (batch, seq, d)
    {stack}.{i}.out                 the layer's output (the residual stream)   (batch, seq, d)

``stack`` is ``blocks`` (a decoder-only model: GPT-2, Llama), ``encoder`` (BERT, a ViT, the
encoder of an encoder–decoder) or ``decoder`` (the encoder–decoder's decoder); ``i`` counts
from 0. ``self_attn.out`` and ``ffn.out`` are what the sublayer adds to the residual stream
(pre-LN: ``x + F(Norm(x))``) or normalises with it (post-LN: ``Norm(x + F(x))``).

Everything is done by hooks registered from outside the model and removed afterwards: a
forward pre-hook on the layer (``.in``) and on W_O, the attention's ``out_proj`` (``.heads``:
its input, viewed as heads), and a forward hook on the attention, the feed-forward and the
layer (``.out``). The model's code and its modules' classes (a CPU kernel's linear, a 4-bit
one) are untouched, so a traced pass takes the path the plain pass takes. A layer shared by
several positions of a stack (ALBERT) is one module: its calls are named in turn.

    stages = trace(model, ids)                          # {name: tensor}, and .output
    with patched(model, {"blocks.3.self_attn.heads": zero_head_2}):
        logits = model(ids)
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput

STACKS = ("encoder", "decoder", "blocks")  # the attribute a model keeps each stack under
ATTENTIONS = ("self_attn", "cross_attn")

Patch = Callable[[Tensor], Tensor]  # a stage's value -> the value the model goes on with


@dataclass(frozen=True)
class Point:
    """Where a stage is taken: ``module``'s input (``pre``) or output, and for ``heads`` its
    input viewed as ``(…, H, d_k)`` of the attention ``attention``."""

    name: str
    module: nn.Module
    pre: bool
    attention: nn.Module | None = None  # set for a ``.heads`` stage


def stacks(model: nn.Module) -> dict[str, nn.ModuleList]:
    """The model's layer stacks by name, in the order they run (``encoder`` before
    ``decoder``)."""
    found = {}
    for name in STACKS:
        stack = getattr(model, name, None)
        if isinstance(stack, nn.Module) and isinstance(getattr(stack, "layers", None),
                                                         nn.ModuleList):
            found[name] = stack.layers
    if not found:
        raise BadInput(f"a {type(model).__name__} has no layer stack to trace")
    return found


def points(model: nn.Module) -> list[Point]:
    """Every stage of ``model`` (module docstring), in the order a forward pass reaches them."""
    found = []
    for stack, layers in stacks(model).items():
        for i, layer in enumerate(layers):
            at = f"{stack}.{i}"
            found.append(Point(f"{at}.in", layer, pre=True))
            for attn in ATTENTIONS:
                m = getattr(layer, attn, None)
                if m is not None:
                    found.append(Point(f"{at}.{attn}.heads", m.out_proj, pre=True, attention=m))
                    found.append(Point(f"{at}.{attn}.out", m, pre=False))
            found.append(Point(f"{at}.ffn.out", layer.ffn, pre=False))
            found.append(Point(f"{at}.out", layer, pre=False))
    return found


def stage_names(model: nn.Module) -> list[str]:
    """The names :func:`trace` records and :func:`patched` replaces, in order."""
    return [p.name for p in points(model)]


def _select(model: nn.Module, patterns: list[str]) -> list[Point]:
    """The points whose names match one of ``patterns`` (shell-style, ``*`` for any part)."""
    every = points(model)
    chosen = [p for p in every if any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)]
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(p.name, pat) for p in every):
            raise BadInput(f"no stage {pat!r} in the model (its stages are named like "
                           f"{every[0].name!r}, {every[-1].name!r})")
    return chosen


def _as_heads(x: Tensor, attention: nn.Module) -> Tensor:
    """W_O's input ``(…, H·d_k)`` as ``(…, H, d_k)`` (a view)."""
    return x.unflatten(-1, (attention.n_heads, attention.d_k))


def _apply(name: str, fn: Patch, value: Tensor) -> Tensor | None:
    """``fn(value)``, or None when it gave the same tensor back (nothing to replace)."""
    new = fn(value)
    if new is value:
        return None
    if new.shape != value.shape:
        raise BadInput(f"the patch of {name} changes its shape {tuple(value.shape)} to "
                       f"{tuple(new.shape)}")
    return new


def _apply_all(name: str, fns: list[Patch], value: Tensor) -> Tensor | None:
    """The patches of one stage applied in turn (several patterns may name it); None when
    none of them replaced the value."""
    changed = None
    for fn in fns:
        new = _apply(name, fn, value if changed is None else changed)
        if new is not None:
            changed = new
    return changed


def _hook(module: nn.Module, pre: bool, attention: nn.Module | None,
          named: list[tuple[str, list[Patch]]]):
    """One hook for ``module``: its n-th call in a pass is stage ``named[n % len(named)]``
    (a shared layer runs once per position of its stack, each under its own name), whose
    patches are applied in turn."""
    calls = [0]

    def pick() -> tuple[str, list[Patch]]:
        name, fns = named[calls[0] % len(named)]
        calls[0] += 1
        return name, fns

    if pre:
        def before(mod, args):
            name, fns = pick()
            x = args[0]
            value = x if attention is None else _as_heads(x, attention)
            new = _apply_all(name, fns, value)
            if new is None:
                return None
            return (new if attention is None else new.flatten(-2), *args[1:])

        return module.register_forward_pre_hook(before)

    def after(mod, args, out):
        name, fns = pick()
        value = out[0] if isinstance(out, tuple) else out  # attention: (output, weights)
        new = _apply_all(name, fns, value)
        if new is None:
            return None
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return module.register_forward_hook(after)


@contextlib.contextmanager
def patched(model: nn.Module, patches: dict[str, Patch]) -> Iterator[None]:
    """Within the block, every forward pass of ``model`` goes on with ``fn(value)`` in place of
    each stage ``name`` of ``patches`` (``{name: fn}``; names as in the module docstring, or
    shell-style patterns). ``fn`` receives the stage's value (batch first) and returns a
    tensor of the same shape; returning its argument itself changes nothing (a recorder)."""
    fns: dict[str, list[Patch]] = {}  # a stage's patches, in the order the patterns come
    for pattern, fn in patches.items():
        for p in _select(model, [pattern]):
            fns.setdefault(p.name, []).append(fn)
    # every name of a patched module, in the order its calls come (a shared layer has several)
    by_module: dict[tuple[int, bool], list] = {}
    for p in points(model):
        key = (id(p.module), p.pre)
        by_module.setdefault(key, [p.module, p.attention, []])[2].append(
            (p.name, fns.get(p.name, [])))
    handles = [_hook(module, pre, attention, named)
               for (_, pre), (module, attention, named) in by_module.items()
               if any(stage_fns for _, stage_fns in named)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class Trace(dict):
    """``{stage name: tensor}`` recorded from one forward pass, and ``output``, what the pass
    returned."""

    output: object = None


def trace(model: nn.Module, *inputs, stages: list[str] | None = None,
          forward: Callable[[], object] | None = None, **kwargs) -> Trace:
    """Run ``model(*inputs, **kwargs)`` (or ``forward()``) under no_grad and record the
    ``stages`` (names or shell-style patterns; default every stage) as detached copies, batch
    dimension kept. A name a shared layer gives several calls keeps the last."""
    run = Trace()

    def recorder(name: str) -> Patch:
        def record(value: Tensor) -> Tensor:
            run[name] = value.detach().clone()
            return value

        return record

    chosen = _select(model, stages or ["*"])
    with torch.no_grad(), patched(model, {p.name: recorder(p.name) for p in chosen}):
        run.output = forward() if forward is not None else model(*inputs, **kwargs)
    return run


def replace_head(head: int, value: Tensor | None = None) -> Patch:
    """A patch of a ``.heads`` stage: head ``head``'s output set to ``value`` (its own
    ``(…, d_k)`` slice, or the whole stage's ``(…, H, d_k)``), or to zeros (ablation)."""
    def patch(heads: Tensor) -> Tensor:
        new = heads.clone()
        if value is None:
            new[..., head, :] = 0
        else:
            new[..., head, :] = value[..., head, :] if value.dim() == heads.dim() else value
        return new

    return patch


__all__ = ["Patch", "Point", "Trace", "patched", "points", "replace_head", "stacks",
           "stage_names", "trace"]
