"""Pruning: weights set to zero by magnitude, and whole attention heads removed by importance.

**Unstructured magnitude pruning** zeroes, in every weight matrix of the layer stacks, the
fraction ``sparsity`` of its entries with the smallest ``|w|`` (per matrix, as
``torch.nn.utils.prune.l1_unstructured``). The matrices stay dense, so the model is no smaller
or faster; it shows how much of a network the task does without.

**Structured head pruning** (Michel, Levy and Neubig, 2019, "Are Sixteen Heads Really Better
than One?"). Give each head ``h`` of each attention layer a gate ``ξ_h`` multiplying its output
before the output projection,

    MultiHead(Q, K, V) = Σ_h ξ_h · head_h · W_O[h],   ξ_h = 1,

and score a head by how much the loss depends on its gate over data ``X``:

    I_h = Σ_{x ∈ X} | ∂L(x) / ∂ξ_h |,

normalised per layer by its L2 norm over the layer's heads (their section 4.2). The lowest
scores go first, ranked across all layers, keeping at least one head in every layer. A pruned
head's rows of ``W_Q``, ``W_K``, ``W_V`` (and biases) and its columns of ``W_O`` are removed,
so the model really gets smaller and faster; the others keep their width ``d_k``. The config
records what is gone (``pruned_heads``, original indices), so that ``build_model`` makes the
same shapes again when the folder is loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn.multihead import MultiHeadAttention


def attention_layers(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention module of ``model`` by its path, in order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


# --- unstructured --------------------------------------------------------------------------------
def magnitude_prune(model: nn.Module, sparsity: float) -> float:
    """Zero the ``sparsity`` fraction of smallest-magnitude entries of each linear weight inside
    the layer stacks (embeddings and output projections untouched), in place. Returns the
    fraction of those weights now zero."""
    if not 0 <= sparsity < 1:
        raise BadInput(f"sparsity must be in [0, 1), got {sparsity}")
    zero = total = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if not isinstance(m, nn.Linear) or ".layers." not in f".{name}":
                continue
            w = m.weight
            k = int(round(sparsity * w.numel()))
            if k:
                cut = w.abs().flatten().kthvalue(k).values
                w.masked_fill_(w.abs() <= cut, 0.0)
            zero += int((w == 0).sum())
            total += w.numel()
    return zero / max(total, 1)


# --- head importance ---------------------------------------------------------------------------
@contextlib.contextmanager
def head_gates(model: nn.Module, gates: dict[str, Tensor]) -> Iterator[None]:
    """Within the block, multiply each head's output by its gate ``gates[path] (n_heads,)``
    before the layer's output projection (a forward pre-hook on ``out_proj``; the model's own
    code is untouched). A gate of 0 masks the head; a gate with ``requires_grad`` measures
    ``∂L/∂ξ_h``."""
    handles = []
    layers = attention_layers(model)
    for path, gate in gates.items():
        layer = layers[path]

        def scale(module, inputs, layer=layer, gate=gate):
            (x,) = inputs  # (..., n_heads · d_k)
            shaped = x.unflatten(-1, (layer.n_heads, layer.d_k)) * gate.to(x.dtype)[:, None]
            return (shaped.flatten(-2),)

        handles.append(layer.out_proj.register_forward_pre_hook(scale))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def head_importance(model: nn.Module, batches: Iterable, loss_fn: Callable[[nn.Module, object],
                                                                           Tensor],
                    normalise: bool = True) -> dict[str, Tensor]:
    """``I_h = Σ_batches |∂L/∂ξ_h|`` for every head of every attention layer (module docstring),
    ``{path: (n_heads,)}``, each layer's scores divided by their L2 norm when ``normalise``.
    ``loss_fn(model, batch)`` returns the batch's mean loss; the weights get no gradient."""
    layers = attention_layers(model)
    gates = {p: torch.ones(m.n_heads, requires_grad=True) for p, m in layers.items()}
    scores = {p: torch.zeros(m.n_heads) for p, m in layers.items()}
    was_training = model.training
    model.eval()
    needs = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        with head_gates(model, gates):
            for batch in batches:
                grads = torch.autograd.grad(loss_fn(model, batch), list(gates.values()))
                for p, g in zip(gates, grads, strict=True):
                    scores[p] += g.abs()
    finally:
        for p, need in zip(model.parameters(), needs, strict=True):
            p.requires_grad_(need)
        model.train(was_training)
    if normalise:
        scores = {p: s / s.norm().clamp(min=1e-20) for p, s in scores.items()}
    return scores


def least_important(scores: dict[str, Tensor], count: int) -> dict[str, list[int]]:
    """The ``count`` lowest-scoring heads across all layers, keeping at least one per layer:
    ``{path: [current head indices]}``."""
    available = sum(len(s) - 1 for s in scores.values())
    if not 0 <= count <= available:
        raise BadInput(f"cannot prune {count} heads: the model has "
                       f"{sum(len(s) for s in scores.values())} in {len(scores)} layers, and "
                       f"each layer keeps one ({available} at most)")
    return lowest_keeping_one(scores, count)


def lowest_keeping_one(scores: dict[str, Tensor], count: int) -> dict[str, list[int]]:
    """The ``count`` lowest scores across the groups (a layer's heads, a stack's layers),
    greedily, never taking a group's last member: ``{group: [indices]}``, each sorted. The
    caller checks that ``count`` is possible."""
    ranked = sorted((float(s[i]), group, i) for group, s in scores.items() for i in range(len(s)))
    chosen: dict[str, list[int]] = {}
    for _, group, i in ranked:
        if sum(len(v) for v in chosen.values()) == count:
            break
        if len(chosen.get(group, [])) < len(scores[group]) - 1:
            chosen.setdefault(group, []).append(i)
    return {g: sorted(v) for g, v in chosen.items()}


# --- removing heads ----------------------------------------------------------------------------
def _keep_rows(linear: nn.Linear, rows: Tensor) -> nn.Linear:
    out = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rows])
    return out


def remove_heads(model: nn.Module, heads: dict[str, list[int]]) -> dict[str, list[int]]:
    """Remove the given heads (current indices per attention path) from ``model``, in place.
    Returns every layer's removed heads in original indices, for ``config.pruned_heads``
    (a layer pruned before keeps ``original_heads``, the original index of each head left)."""
    if getattr(model.config, "share_layers", False):
        raise BadInput("heads cannot be pruned from shared layers (share_layers=True, ALBERT): "
                       "every layer is the same module")
    layers = attention_layers(model)
    pruned = dict(getattr(model.config, "pruned_heads", {}) or {})
    for path, drop in heads.items():
        if path not in layers:
            raise BadInput(f"no attention layer {path!r} in the model")
        layer = layers[path]
        if layer.num_kv_heads != layer.n_heads:
            raise BadInput(f"{path}: heads are pruned only without grouped-query attention "
                           f"({layer.n_heads} query heads share {layer.num_kv_heads} key/value "
                           "heads)")
        if not drop:
            continue
        if len(set(drop)) != len(drop) or not all(0 <= h < layer.n_heads for h in drop):
            raise BadInput(f"{path}: heads {drop} are not distinct indices in "
                           f"0..{layer.n_heads - 1}")
        if len(drop) >= layer.n_heads:
            raise BadInput(f"{path}: cannot prune {len(drop)} of its {layer.n_heads} heads; a "
                           "layer keeps at least one")
        original = getattr(layer, "original_heads", list(range(layer.n_heads)))
        keep = [h for h in range(layer.n_heads) if h not in drop]
        d_k = layer.d_k
        cols = torch.cat([torch.arange(h * d_k, (h + 1) * d_k) for h in keep])
        with torch.device(layer.out_proj.weight.device):  # a meta skeleton stays on meta
            new = MultiHeadAttention(layer.out_proj.out_features, len(keep), len(keep),
                                     bias=layer.out_proj.bias is not None,
                                     fused_qkv=layer.fused_qkv, dropout=layer.dropout,
                                     head_dim=d_k, scale=layer.scale)
        new.to(dtype=layer.out_proj.weight.dtype).train(layer.training)
        if layer.fused_qkv:  # rows [Q | K | V], each h·d_k wide
            q = layer.q_dim
            new.qkv = _keep_rows(layer.qkv, torch.cat([cols, q + cols, 2 * q + cols]))
        else:
            new.q_proj, new.k_proj, new.v_proj = (_keep_rows(getattr(layer, n), cols)
                                                  for n in ("q_proj", "k_proj", "v_proj"))
        with torch.no_grad():
            new.out_proj.weight.copy_(layer.out_proj.weight[:, cols])
            if layer.out_proj.bias is not None:
                new.out_proj.bias.copy_(layer.out_proj.bias)
        new.original_heads = [original[h] for h in keep]
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        pruned[path] = sorted(set(range(model.config.n_heads)) - set(new.original_heads))
    return pruned


def apply_pruned_heads(model: nn.Module, pruned: dict[str, list[int]]) -> nn.Module:
    """Give a freshly built model the shapes ``config.pruned_heads`` records (its weights are
    loaded next): each listed layer loses those original heads."""
    if pruned:
        remove_heads(model, pruned)
    return model


__all__ = ["apply_pruned_heads", "attention_layers", "head_gates", "head_importance",
           "least_important", "magnitude_prune", "remove_heads"]
