"""Structured pruning of whole feed-forward channels and whole layers: the model gets smaller.

**Feed-forward channels.** Channel ``j`` of a feed-forward network is row ``j`` of ``W₁`` (and
of ``W₃`` for a gated one: SwiGLU, GEGLU) and column ``j`` of ``W₂``: it reads ``x`` and writes
one number back through ``W₂[:, j]``. Its importance is the course's channel criterion
``Σ_k |W_{j,k}|`` over every weight the channel owns,

    I_j = Σ_k |W₁[j, k]| + Σ_k |W₃[j, k]| + Σ_i |W₂[i, j]|        (W₃ only when gated),

and each layer keeps its ``d_ff − round(f · d_ff)`` most important channels (their biases
``b₁[j]``, ``b₃[j]`` with them; ``b₂`` stays). Every layer loses the same number, so ``d_ff``
stays one number in the config and the folder exports as any model of that width. Removing
channel ``j`` computes exactly what the unpruned model computes with ``W₂[:, j] = 0``.

**Layers** (the course's layer pruning criterion). Layer ``l``'s importance is how much the
model's final hidden states change when the layer is skipped (replaced by the identity, so the
residual stream passes through it untouched),

    I_l = ‖H_with − H_without_l‖_F / ‖H_with‖_F,

where ``H`` stacks, over every real token of the data, the output of the model's last stack
(after its final norm): the decoder's for an encoder–decoder, the blocks' for a decoder-only
model, the encoder's for BERT. Every layer is scored against the whole model (one shot, not
re-scored after each removal); the lowest go, ranked across the model's stacks, each stack
keeping at least one layer. The config's ``n_encoder_layers``/``n_decoder_layers`` shrink, and
``extra["pruned"]`` records each structured pruning step (layer indices as they were before
that step).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from attnlab.compression.prune import _keep_rows, lowest_keeping_one
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.nn.blocks import Decoder, Encoder, _SelfAttentionStack
from attnlab.nn.feedforward import FeedForward


def _plain(model: nn.Module, what: str) -> None:
    """Structured pruning edits plain float layers of a model without adapters."""
    if getattr(model.config, "adapter", None):
        raise BadInput(f"{what} are pruned from a model without adapters: merge or drop the "
                       "adapter first")


# --- feed-forward channels -----------------------------------------------------------------------
def feedforwards(model: nn.Module) -> dict[str, FeedForward]:
    """Every feed-forward network of ``model`` by its path, in order; a layer shared N times
    (ALBERT) once."""
    found: dict[str, FeedForward] = {}
    seen: set[int] = set()
    for name, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, FeedForward) and id(m) not in seen:
            seen.add(id(m))
            found[name] = m
    return found


def channel_importance(ffn: FeedForward) -> Tensor:
    """``I_j = Σ|W₁[j, :]| (+ Σ|W₃[j, :]|) + Σ|W₂[:, j]|`` (module docstring): ``(d_ff,)``."""
    linears = [ffn.w1, ffn.w2] + ([] if ffn.w3 is None else [ffn.w3])
    if not all(type(m) is nn.Linear for m in linears):
        raise BadInput("feed-forward channels are pruned from float nn.Linear layers; prune "
                       "the float model, then quantise or adapt it")
    with torch.no_grad():
        score = ffn.w1.weight.abs().sum(1) + ffn.w2.weight.abs().sum(0)
        if ffn.w3 is not None:
            score = score + ffn.w3.weight.abs().sum(1)
    return score.float()


def kept_channels(score: Tensor, keep: int) -> Tensor:
    """The ``keep`` highest-scoring channels, in their original order (ties: the lower index)."""
    return torch.argsort(score, descending=True, stable=True)[:keep].sort().values


def _keep_columns(linear: nn.Linear, cols: Tensor) -> nn.Linear:
    out = nn.Linear(len(cols), linear.out_features, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, cols])
        if linear.bias is not None:  # b₂ belongs to the outputs, not to a channel
            out.bias.copy_(linear.bias)
    return out


def prune_channels(model: nn.Module, fraction: float) -> ModelConfig:
    """Remove ``round(fraction · d_ff)`` channels, the least important, from every feed-forward
    network of ``model``, in place. Returns the new config (also set on the model): ``d_ff``
    smaller, the step recorded in ``extra["pruned"]``."""
    if not 0 < fraction < 1:
        raise BadInput(f"--ffn must be a share of the channels in (0, 1), got {fraction}")
    _plain(model, "feed-forward channels")
    config = model.config
    drop = round(fraction * config.d_ff)
    keep = config.d_ff - drop
    if drop == 0 or keep == 0:
        raise BadInput(f"--ffn {fraction} of d_ff={config.d_ff} removes {drop} channels; "
                       f"choose a share that removes between 1 and {config.d_ff - 1}")
    for ffn in feedforwards(model).values():
        channels = kept_channels(channel_importance(ffn), keep)
        ffn.w1 = _keep_rows(ffn.w1, channels)
        if ffn.w3 is not None:
            ffn.w3 = _keep_rows(ffn.w3, channels)
        ffn.w2 = _keep_columns(ffn.w2, channels)
    step = {"ffn": fraction, "d_ff": [config.d_ff, keep]}
    model.config = dataclasses.replace(config, d_ff=keep, extra=_recorded(config, step))
    return model.config


def _recorded(config: ModelConfig, step: dict) -> dict:
    return {**config.extra, "pruned": [*config.extra.get("pruned", []), step]}


# --- layers ------------------------------------------------------------------------------------
def layer_stacks(model: nn.Module) -> dict[str, nn.ModuleList]:
    """Every stack's list of layers by the stack's path, in order (an encoder–decoder's
    ``encoder`` then ``decoder``; GPT's ``blocks``; BERT's ``encoder``)."""
    return {n: m.layers for n, m in model.named_modules()
            if isinstance(m, (_SelfAttentionStack, Decoder))}


def final_stack(model: nn.Module) -> nn.Module:
    """The stack whose output is the model's final hidden states (what the head reads)."""
    stacks = [n for n, m in model.named_modules() if isinstance(m, (_SelfAttentionStack, Decoder))]
    if not stacks:
        raise BadInput(f"{type(model).__name__} has no layer stack to prune")
    return model.get_submodule(stacks[-1])


@contextlib.contextmanager
def without_layer(model: nn.Module, stack: str, index: int) -> Iterator[None]:
    """Within the block, ``stack`` runs without its layer ``index`` (the identity in its
    place: the residual stream passes on unchanged)."""
    owner = model.get_submodule(stack)
    layers = owner.layers
    owner.layers = nn.ModuleList(m for i, m in enumerate(layers) if i != index)
    try:
        yield
    finally:
        owner.layers = layers


@contextlib.contextmanager
def final_hidden(model: nn.Module) -> Iterator[list[Tensor]]:
    """Within the block, each forward pass appends its final hidden states ``(batch, seq, d)``
    to the list it yields."""
    seen: list[Tensor] = []
    handle = final_stack(model).register_forward_hook(lambda m, i, out: seen.append(out))
    try:
        yield seen
    finally:
        handle.remove()


Run = Callable[[nn.Module, object], "Tensor | None"]


def _hidden(model: nn.Module, batches: list, run: Run) -> list[Tensor]:
    """The final hidden states of the real tokens of each batch, ``(n_real, d)`` each."""
    out = []
    with final_hidden(model) as seen, torch.no_grad():
        for batch in batches:
            seen.clear()
            real = run(model, batch)
            h = seen[-1].float()
            out.append(h.flatten(0, -2) if real is None else h[real.bool()])
    return out


def layer_importance(model: nn.Module, batches: Iterable, run: Run) -> dict[str, Tensor]:
    """``I_l = ‖H_with − H_without_l‖_F / ‖H_with‖_F`` for every layer of every stack
    (module docstring), ``{stack: (n_layers,)}``. ``run(model, batch)`` runs the model on the
    batch and returns its real tokens ``(batch, seq)`` bool (None: all of them); ``H`` stacks
    the final hidden states of those tokens over all batches."""
    batches = list(batches)
    was_training = model.training
    model.eval()
    try:
        full = _hidden(model, batches, run)
        norm = sum(float(h.double().square().sum()) for h in full) ** 0.5
        scores = {}
        for stack, layers in layer_stacks(model).items():
            scores[stack] = torch.zeros(len(layers), dtype=torch.float64)
            for i in range(len(layers)):
                with without_layer(model, stack, i):
                    skipped = _hidden(model, batches, run)
                diff = sum(float((a.double() - b.double()).square().sum())
                           for a, b in zip(full, skipped, strict=True))
                scores[stack][i] = diff ** 0.5 / max(norm, 1e-30)
    finally:
        model.train(was_training)
    return scores


def least_important_layers(scores: dict[str, Tensor], count: int) -> dict[str, list[int]]:
    """The ``count`` lowest-scoring layers across the stacks, each stack keeping at least one:
    ``{stack: [layer indices]}``."""
    total = sum(len(s) for s in scores.values())
    available = total - len(scores)
    if not 0 < count <= available:
        raise BadInput(f"--layers {count}: the model has {total} layers in {len(scores)} "
                       f"stack{'s' if len(scores) > 1 else ''}, each keeping one, so 1 to "
                       f"{available} can go")
    return lowest_keeping_one(scores, count)


def drop_layers(model: nn.Module, drop: dict[str, list[int]]) -> ModelConfig:
    """Remove the given layers (indices per stack path) from ``model``, in place. Returns the
    new config (also set on the model): the stacks' layer counts smaller, ``pruned_heads``
    renumbered to the layers that stay, the step recorded in ``extra["pruned"]``."""
    _plain(model, "layers")
    stacks = layer_stacks(model)
    config = model.config
    counts = {}
    heads = dict(config.pruned_heads)
    for stack, indices in drop.items():
        if stack not in stacks:
            raise BadInput(f"no layer stack {stack!r} in the model")
        layers = stacks[stack]
        if not indices or len(set(indices)) != len(indices) or not all(
                0 <= i < len(layers) for i in indices) or len(indices) >= len(layers):
            raise BadInput(f"{stack}: layers {indices} are not distinct indices of 0.."
                           f"{len(layers) - 1} that leave one")
        keep = [i for i in range(len(layers)) if i not in indices]
        model.get_submodule(stack).layers = nn.ModuleList(layers[i] for i in keep)
        field = ("n_encoder_layers" if isinstance(model.get_submodule(stack), Encoder)
                 else "n_decoder_layers")
        counts[field] = len(keep)
        heads = _renumbered(heads, f"{stack}.layers.", keep)
    step = {"layers": {stack: sorted(v) for stack, v in drop.items()}}
    model.config = dataclasses.replace(config, **counts, pruned_heads=heads,
                                       extra=_recorded(config, step))
    return model.config


def _renumbered(heads: dict[str, list[int]], prefix: str, keep: list[int]) -> dict:
    """``pruned_heads`` with the paths under ``prefix`` following their layers to their new
    indices (a dropped layer's heads go with it)."""
    new = {int(i): n for n, i in enumerate(keep)}
    out = {}
    for path, hs in heads.items():
        if path.startswith(prefix):
            index, _, rest = path[len(prefix):].partition(".")
            if int(index) not in new:
                continue
            path = f"{prefix}{new[int(index)]}.{rest}"
        out[path] = hs
    return out


__all__ = ["channel_importance", "drop_layers", "feedforwards", "final_hidden", "final_stack",
           "kept_channels", "layer_importance", "layer_stacks", "least_important_layers",
           "prune_channels", "without_layer"]
