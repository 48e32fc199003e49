"""Building a model from its config, the one place it happens, and checking an untrusted
config before anything is allocated.

:func:`build_model` builds the class that ``config.arch`` names
(:data:`attnlab.models.ARCHITECTURES`). A config decides how much memory the model takes, and a
config file can lie: 10^7 layers beside a weights file of a few kilobytes. Before a model is
built from a file, three checks run, each cheap:

1. **Size**: the parameter count P the config describes, from models of one and two layers
   built on the ``meta`` device (no memory; every family is linear in its layer counts):

       P = P(1, 1) + (L_enc − 1)·ΔP_enc + (L_dec − 1)·ΔP_dec

   must fit the weights file, at ``min_bytes`` bytes a parameter (1 for safetensors, which
   stores at least a byte a number; 0.5 for 4-bit GGUF), and 4·P bytes (float32) must fit
   the memory this process may use.
2. **Shapes**: the whole model built on ``meta``, its tensors' names and shapes compared with
   the file's header (safetensors header, GGUF tensor infos), read without the data. The
   first tensor that differs is named.
3. Only then is the model built for real and its weights read.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from torch.overrides import TorchFunctionMode

from attnlab import hardware
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.models import ARCHITECTURES
from attnlab.nn.adapters import add_adapters

GB = 2**30


def build_model(config: ModelConfig) -> nn.Module:
    """The model class the config's ``arch`` names, built (and initialised) from the config."""
    if config.arch not in ARCHITECTURES:
        raise BadInput(f"config field arch={config.arch!r}: no model family implements it yet")
    model = ARCHITECTURES[config.arch](config)
    if config.pruned_heads:  # the shapes of a pruned model (compression/prune.py)
        from attnlab.compression.prune import apply_pruned_heads

        apply_pruned_heads(model, config.pruned_heads)
    if config.adapter:  # LoRA or bottleneck adapters over the frozen model (nn/adapters.py)
        try:
            add_adapters(model, config.adapter)
        except ValueError as e:
            raise BadInput(f"config field adapter: {e}") from None
    return model


class _NoInitialisation(TorchFunctionMode):
    """The in-place initialisers as no-ops: a skeleton has no values to draw, and drawing
    them on ``meta`` tensors costs seconds (the first ``normal_`` loads the meta kernels'
    decompositions), which every command checking a config against its file would pay."""

    SKIPPED = frozenset({nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_,
                         nn.init.xavier_uniform_, nn.init.kaiming_uniform_, nn.init.zeros_,
                         nn.init.ones_, nn.init.constant_, torch.Tensor.normal_,
                         torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIPPED:
            tensor = args[0] if args else kwargs.get("tensor")
            if getattr(tensor, "is_meta", False):
                return tensor
        return func(*args, **kwargs)


def skeleton(config: ModelConfig) -> nn.Module:
    """The model the config describes, on the ``meta`` device: shapes, no memory (and no
    initial values: :func:`materialize` initialises when it allocates)."""
    with torch.device("meta"), _NoInitialisation():
        return build_model(config)


def materialize(model: nn.Module) -> nn.Module:
    """A ``meta`` model (:func:`skeleton`) given uninitialised CPU storage and its computed
    buffers (position tables) remade, ready for every weight to be loaded into it: no random
    initialisation, and a quantised folder never holds the float model in memory."""
    from attnlab.nn.positional import PositionalEncoding

    first, ties = {}, []  # to_empty gives each module its own tensors: tied weights untie
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) in first:
                    ties.append((module, name, first[id(p)]))
                else:
                    first[id(p)] = (module, name)
    model.to_empty(device="cpu")
    for module, name, (owner, owner_name) in ties:
        setattr(module, name, getattr(owner, owner_name))
    for module in model.modules():
        if isinstance(module, PositionalEncoding):  # remade as built, then cast as the model was
            dtypes = {name: b.dtype for name, b in module.named_buffers(recurse=False)}
            module.reset_buffers()
            for name, dtype in dtypes.items():
                setattr(module, name, getattr(module, name).to(dtype))
    return model


def count_parameters(source: nn.Module | Iterable[nn.Module] | ModelConfig,
                     trainable_only: bool = False) -> int:
    """Number of parameters, a tensor shared by several modules (tied weights) counted once.
    ``source``: a model, several modules (a component), or a config: then the count of
    ``build_model(config)`` without building its layers (P(1, 1) and one more layer of each
    stack on ``meta``; the module docstring's formula), its pruned heads and adapters included.
    ``trainable_only``: only the parameters that require gradients (of a model)."""
    if isinstance(source, ModelConfig):
        if trainable_only:
            raise ValueError("trainable_only counts a built model's parameters, not a config's")
        return _config_parameters(source)
    seen: dict[int, int] = {}
    for module in [source] if isinstance(source, nn.Module) else source:
        for p in module.parameters():
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


def _config_parameters(config: ModelConfig) -> int:
    def count(n_enc: int, n_dec: int) -> int:
        small = dataclasses.replace(config, n_encoder_layers=n_enc, n_decoder_layers=n_dec,
                                    pruned_heads={}, adapter={},
                                    attention_window=_one_window(config))
        return count_parameters(skeleton(small))

    enc, dec = min(config.n_encoder_layers, 1), min(config.n_decoder_layers, 1)
    base = count(enc, dec)
    per_enc = count(enc + 1, dec) - base if enc else 0
    per_dec = count(enc, dec + 1) - base if dec else 0
    # a pruned head took its d_k rows of W_Q, W_K, W_V (and biases) and columns of W_O
    per_head = 4 * config.d_k * config.d_model + (3 * config.d_k if config.biased_qkv else 0)
    pruned = sum(len(heads) for heads in config.pruned_heads.values()) * per_head
    return (base + max(config.n_encoder_layers - 1, 0) * per_enc
            + max(config.n_decoder_layers - 1, 0) * per_dec - pruned + _adapter_parameters(config))


def _one_window(config: ModelConfig) -> int | None:
    """A Longformer's per-layer windows as one (a skeleton of fewer layers takes it; the
    window changes no parameter count)."""
    windows = config.attention_windows
    return windows[0] if windows else None


def _adapter_parameters(config: ModelConfig) -> int:
    """r·(in + out) per LoRA matrix, 2·m·d + m + d per bottleneck adapter, read off a
    one-layer skeleton (every layer of a stack has the same shapes)."""
    spec = config.adapter
    if not spec:
        return 0
    small = skeleton(dataclasses.replace(
        config, n_encoder_layers=min(config.n_encoder_layers, 1), pruned_heads={}, adapter={},
        attention_window=_one_window(config),
        n_decoder_layers=min(config.n_decoder_layers, 1)))
    shapes = {name: (m.in_features, m.out_features) for name, m in small.named_modules()
              if hasattr(m, "out_features")}
    total = 0
    for path in spec["modules"]:
        d_in, d_out = shapes.get(re.sub(r"\.layers\.\d+\.", ".layers.0.", path), (0, 0))
        total += (spec["r"] * (d_in + d_out) if spec["method"] == "lora"
                  else 2 * spec["size"] * d_out + spec["size"] + d_out)
    return total



def check_affordable(config: ModelConfig, where: str | os.PathLike, file_bytes: int | None,
                     min_bytes: float = 1.0, bytes_per_parameter: int = 4,
                     what: str = "the model") -> int:
    """Refuse a config whose parameters cannot be in a file of ``file_bytes`` or cannot fit the
    available memory at ``bytes_per_parameter``; returns the parameter count."""
    n = count_parameters(config)
    if file_bytes is not None and n * min_bytes > file_bytes:
        raise BadInput(f"{where}: the config describes {n:,} parameters, but the weights hold "
                       f"only {file_bytes:,} bytes: the config and the weights disagree")
    need, available = n * bytes_per_parameter, hardware.available_memory()
    if available is not None and need > available:
        raise BadInput(f"{where}: {what} needs about {need / GB:.1f} GB ({n:,} parameters at "
                       f"{bytes_per_parameter} bytes), more than the {available / GB:.1f} GB "
                       "of memory available")
    return n


TABLES_FREE = 2**24  # computed numbers any model may have: 64 MB of position tables


def checked_skeleton(config: ModelConfig, where: str | os.PathLike, file_bytes: int,
                     min_bytes: float = 1.0) -> nn.Module:
    """The checks every loader runs before building from a file: the parameter count against
    the file and the memory (:func:`check_affordable`), sizes torch can describe at all, and
    the computed position tables (sinusoidal or RoPE, ``max_len`` rows, built rather than
    read). The file backs those tables only through ``max_len``; they may hold up to
    ``TABLES_FREE`` numbers, or as many as the parameters the file holds, so that a context
    length the weights do not back cannot allocate without bound. Returns the ``meta``
    model, for :func:`check_shapes`."""
    try:
        n = check_affordable(config, where, file_bytes, min_bytes)
        model = skeleton(config)
    except (RuntimeError, OverflowError, TypeError) as e:  # sizes torch cannot even describe
        raise BadInput(f"{where}: the config describes sizes that cannot be built "
                       f"({str(e).splitlines()[0]})") from None
    tables = sum(b.numel() for b in model.buffers())
    if tables > max(n, TABLES_FREE):
        raise BadInput(f"{where}: a context of {config.max_len:,} positions needs tables of "
                       f"{tables:,} numbers, more than the model's {n:,} parameters: the "
                       "config and the weights disagree")
    return model


def safetensors_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape from the headers of safetensors files (no data read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError, ValueError) as e:
            raise BadInput(f"{path}: truncated or corrupted safetensors file ({e})") from None
    return shapes


def expected_shapes(model: nn.Module) -> list[tuple[list[str], tuple[int, ...]]]:
    """Each distinct tensor of ``model.state_dict()``: its names (tied weights have several)
    and its shape."""
    groups: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), ([], tuple(t.shape)))[0].append(name)
    return list(groups.values())


def check_shapes(expected: list[tuple[list[str], tuple[int, ...]]],
                 found: dict[str, tuple[int, ...]], where: str | os.PathLike) -> None:
    """Every expected tensor stored under one of its names with its shape, and nothing else."""
    known = {name for names, _ in expected for name in names}
    for name in found:
        if name not in known:
            raise BadInput(f"{where}: tensor {name!r} does not belong to the model the config "
                           "describes")
    for names, shape in expected:
        stored = [n for n in names if n in found]
        if not stored:
            raise BadInput(f"{where}: tensor {names[0]!r} {shape} is missing")
        if found[stored[0]] != shape:
            raise BadInput(f"{where}: tensor {stored[0]!r} is {found[stored[0]]} in the file but "
                           f"{shape} in the model the config describes")


def check_training_memory(config: ModelConfig, batch: int, seq: int, options: str,
                          device: torch.device | str | None = None) -> None:
    """Refuse a training run that cannot fit the available memory: 16 bytes a parameter
    (weights, gradients, Adam's two moments, in float32) plus the activations kept for the
    backward pass, about L·B·T·(68·d + 10·h·T) bytes in float32 (Korthikanti et al., 2022,
    with the attention scores of a non-fused path). ``options`` names what sets the sizes."""
    layers = config.n_encoder_layers + config.n_decoder_layers
    n = count_parameters(config)
    need = 16 * n + layers * batch * seq * (68 * config.d_model + 10 * config.n_heads * seq)
    available = hardware.available_memory(device)
    if available is not None and need > available:
        raise BadInput(f"{options}: training needs about {need / GB:.1f} GB ({n:,} parameters, "
                       f"batch {batch} x {seq} tokens), more than the {available / GB:.1f} GB "
                       "of memory available")
