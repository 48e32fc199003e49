"""Parameter-efficient fine-tuning: a frozen model plus small trained modules, LoRA
(:mod:`attnlab.nn.lora`) or bottleneck adapters (:mod:`attnlab.nn.bottleneck`), chosen by one
spec that a model's config records (``ModelConfig.adapter``), so a checkpoint of an adapted
model rebuilds as it was saved:

    {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.05,
     "modules": ["blocks.layers.0.self_attn.q_proj", ...],   # the wrapped linears
     "trainable": ["classifier"]}                             # trained in full (a new head)

    {"method": "bottleneck", "size": 64, "activation": "relu", "modules": [...], ...}

Everything else is frozen (``requires_grad=False``), so an optimizer built from the
parameters that require gradients holds state for the adapters alone. Which linears a user's
target names select (peft's ``q_proj``, BERT's ``query``, attnlab's ``w1``) is decided in the
model layer (:mod:`attnlab.interop.peft`), which knows the Hugging Face names.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.nn.bottleneck import BottleneckAdapter
from attnlab.nn.lora import LoRALinear, mergeable

# where Houlsby et al. put the adapters: after attention's output projection and after the
# feed-forward's second matrix
BOTTLENECK_TARGETS = ("out_proj", "w2")
ADAPTER_TYPES = (LoRALinear, BottleneckAdapter)


def add_adapters(model: nn.Module, spec: dict[str, Any]) -> nn.Module:
    """Wrap each linear that ``spec["modules"]`` names, freeze every other parameter except
    those of the ``spec["trainable"]`` modules, in place; returns ``model``."""
    modules = dict(model.named_modules())
    for path in spec["modules"]:
        if path not in modules or not hasattr(modules[path], "out_features"):
            raise ValueError(f"adapter: the model has no linear layer {path!r}")
    for p in model.parameters():
        p.requires_grad_(False)
    for path in spec["modules"]:
        parent, _, name = path.rpartition(".")
        owner = modules[parent] if parent else model
        base = getattr(owner, name)
        if spec["method"] == "lora":
            wrapped = LoRALinear(base, spec["r"], spec["alpha"], spec.get("dropout", 0.0))
        else:
            wrapped = BottleneckAdapter(base, spec["size"], spec.get("activation", "relu"))
        setattr(owner, name, wrapped)
    for path in spec.get("trainable", []):
        if path not in modules:
            raise ValueError(f"adapter: the model has no module {path!r} to train")
        for p in modules[path].parameters():
            p.requires_grad_(True)
    return model


def adapters(model: nn.Module) -> dict[str, LoRALinear | BottleneckAdapter]:
    """The model's adapted layers by module path."""
    return {name: m for name, m in model.named_modules() if isinstance(m, ADAPTER_TYPES)}


def merge(model: nn.Module) -> None:
    """Fold every LoRA update into its weight (``W ← W + (α/r)·B A``); :func:`unmerge` undoes
    it exactly."""
    for layer in adapters(model).values():
        if isinstance(layer, LoRALinear):
            layer.merge()


def unmerge(model: nn.Module) -> None:
    for layer in adapters(model).values():
        if isinstance(layer, LoRALinear):
            layer.unmerge()


def fold_lora(model: nn.Module) -> bool:
    """Replace every LoRA layer by its base with the update folded in (inference: the plain
    model again, at the plain model's speed). A quantised base keeps its LoRA path. Returns
    whether any layer remains adapted."""
    modules = dict(model.named_modules())
    left = False
    for path, layer in adapters(model).items():
        if isinstance(layer, LoRALinear) and mergeable(layer.base):
            parent, _, name = path.rpartition(".")
            setattr(modules[parent] if parent else model, name, layer.folded())
        else:
            left = True
    return left


def trainable_state(model: nn.Module) -> dict[str, Any]:
    """The parameters that train (adapters and the ``trainable`` modules), by name."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}
