"""Parameter counting: total, and per component for ``attnlab info``."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn


def count_parameters(module: nn.Module | list[nn.Module], trainable_only: bool = False) -> int:
    """Number of parameters; a tensor shared by several modules (tied weights) counts once."""
    modules = module if isinstance(module, list) else [module]
    seen: dict[int, int] = {}
    for m in modules:
        for p in m.parameters():
            if not trainable_only or p.requires_grad:
                seen[id(p)] = p.numel()
    return sum(seen.values())


def parameter_breakdown(model: nn.Module) -> OrderedDict[str, int]:
    """Counts per named component (from ``model.components()``), then ``total``."""
    table: OrderedDict[str, int] = OrderedDict()
    components = getattr(model, "components", None)
    if components is not None:
        for name, modules in components().items():
            table[name] = count_parameters(modules)
    table["total"] = count_parameters(model)
    return table
