"""Adapters in peft's on-disk format, and the names that choose which layers they adapt.

A folder holds ``adapter_config.json`` (peft's ``LoraConfig`` fields: ``peft_type``, ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``, ``modules_to_save``, ...) and
``adapter_model.safetensors``, whose keys are the transformers model's module names under
``base_model.model.``::

    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight    (r, in)
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight    (out, r)
    base_model.model.classifier.weight                                 (a module trained in full)

attnlab writes and reads these names through the Hugging Face family tables of
:mod:`attnlab.interop.huggingface`, so an adapter trained here loads with ``peft`` onto the
transformers model and one trained with ``peft`` loads here. A model no transformers class
stores (a from-scratch config the families refuse) keeps attnlab's own module names.
Bottleneck adapters have no peft type: they are written in the same layout with
``"peft_type": "ATTNLAB_BOTTLENECK"``, and only attnlab reads them.

Target names are matched as peft matches them, by the module name's last components, in
either vocabulary: ``q_proj``/``v_proj`` (Llama, attnlab), ``query``/``value`` (BERT),
``c_attn`` (GPT-2's fused Q/K/V, attnlab's ``qkv``), ``w1``/``gate_proj``; and the short
``q, k, v, o`` for attnlab's ``q_proj, k_proj, v_proj, out_proj``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from attnlab.config import ModelConfig, check_adapter
from attnlab.errors import BadInput, MissingFile, UnsupportedFormat
from attnlab.files import read_json
from attnlab.interop.huggingface import FAMILIES, default_type, layer_rows
from attnlab.nn.adapters import BOTTLENECK_TARGETS, adapters, add_adapters

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
MAX_CONFIG_BYTES = 1 << 20  # an adapter_config.json is a few hundred bytes
BOTTLENECK = "ATTNLAB_BOTTLENECK"
SHORT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
DEFAULT_TARGETS = ("q_proj", "v_proj", "qkv")  # peft's defaults for BERT, GPT-2 and Llama
# task heads a fine-tuning run trains in full (peft's modules_to_save): a classifier or
# tagger's, and question answering's span head (transformers' qa_outputs)
HEADS = ("classifier", "qa")
_TASK_TYPES = {"decoder": "CAUSAL_LM", "encoder-decoder": "SEQ_2_SEQ_LM"}
# peft options that change what a LoRA layer computes; attnlab reads none of them
_UNREAD = {"use_dora": False, "use_rslora": False, "lora_bias": False, "bias": "none",
           "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
           "use_qalora": False, "trainable_token_indices": None}


def parameter_names(config: ModelConfig) -> dict[str, str]:
    """attnlab parameter name -> the transformers model's, for a config that a Hugging Face
    family stores ({} when none does: attnlab's names are used as they are)."""
    try:
        family = FAMILIES[config.extra.get("hf_model_type") or default_type(config)]
        family.from_config(dataclasses.replace(config, adapter={}))
    except (BadInput, KeyError):
        return {}
    return {ours: theirs for ours, theirs, _ in layer_rows(family.weights(config), config)}


def module_names(config: ModelConfig) -> dict[str, str]:
    """attnlab module path -> the transformers model's (from the weight names)."""
    return {ours.removesuffix(".weight"): theirs.removesuffix(".weight")
            for ours, theirs in parameter_names(config).items()
            if ours.endswith(".weight") and theirs.endswith(".weight")}


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def resolve_targets(model: nn.Module, targets: list[str] | None,
                    method: str = "lora") -> list[str]:
    """The paths of the linear layers that ``targets`` name (see the module docstring); the
    defaults are peft's (LoRA: the query and value projections) and Houlsby's (bottleneck:
    after attention's output projection and the feed-forward)."""
    targets = [SHORT.get(t, t) for t in (targets or (
        DEFAULT_TARGETS if method == "lora" else BOTTLENECK_TARGETS))]
    theirs = module_names(model.config)
    linears = [name for name, m in model.named_modules()
               if hasattr(m, "out_features") and name and not name.endswith((".lora_A", ".lora_B"))]
    chosen = [name for name in linears
              if any(_matches(name, t) or _matches(theirs.get(name, ""), t) for t in targets)]
    if not chosen:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise BadInput(f"no linear layer of the model matches the targets {','.join(targets)} "
                       f"(its layers: {', '.join(leaves)})")
    return chosen


def adapter_spec(model: nn.Module, method: str = "lora", r: int = 8, alpha: float | None = None,
                 dropout: float = 0.0, targets: list[str] | None = None, size: int = 64,
                 trainable: list[str] | None = None) -> dict[str, Any]:
    """The spec :func:`attnlab.nn.adapters.add_adapters` applies: LoRA of rank ``r`` (α
    defaults to 2r) or bottleneck adapters of ``size``, on the layers ``targets`` names, with
    the model's task head (``classifier``) trained in full unless ``trainable`` says which."""
    modules = dict(model.named_modules())
    spec: dict[str, Any] = {"method": method,
                            "modules": resolve_targets(model, targets, method),
                            "trainable": [h for h in HEADS if h in modules]
                            if trainable is None else trainable,
                            "targets": list(targets or [])}
    if method == "lora":
        spec.update(r=r, alpha=float(2 * r if alpha is None else alpha), dropout=dropout)
    else:
        spec.update(size=size, activation="relu")
    check_adapter(spec, "adapter")
    return spec


def adapt(model: nn.Module, spec: dict[str, Any]) -> nn.Module:
    """``model`` with the adapters of ``spec`` added (in place) and recorded in its config, so
    that its checkpoints rebuild as they were saved."""
    if model.config.adapter:
        raise BadInput("the model already has adapters (fold them in first)")
    try:
        add_adapters(model, spec)
    except ValueError as e:
        raise BadInput(str(e)) from None
    model.config = dataclasses.replace(model.config, adapter=spec)
    return model


# --- the folder ----------------------------------------------------------------------------
def save_adapter(model: nn.Module, folder: str | os.PathLike, base: str = "") -> Path:
    """Write the model's adapters and its fully trained modules as a peft folder; ``base``
    is recorded as ``base_model_name_or_path``."""
    config: ModelConfig = model.config
    spec = config.adapter
    if not spec:
        raise BadInput("the model has no adapters to save")
    modules, params = module_names(config), parameter_names(config)
    layers = adapters(model)
    out: dict[str, torch.Tensor] = {}
    parts = (("lora_A", "lora_B") if spec["method"] == "lora"
             else ("adapter_down", "adapter_up"))
    for path in spec["modules"]:
        for part in parts:
            for kind, tensor in getattr(layers[path], part).named_parameters():
                out[f"{PREFIX}{modules.get(path, path)}.{part}.{kind}"] = tensor
    for name, tensor in model.named_parameters():
        if any(name.startswith(m + ".") for m in spec.get("trainable", [])):
            out[PREFIX + params.get(name, name)] = tensor
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in out.items()},
              str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(_peft_config(config, base), indent=2) + "\n")
    return folder


def _peft_config(config: ModelConfig, base: str) -> dict[str, Any]:
    spec, names = config.adapter, module_names(config)
    chosen = [names.get(p, p) for p in spec["modules"]]
    leaves = sorted({n.rsplit(".", 1)[-1] for n in chosen})
    every = [names.get(p, p) for p in names] or chosen
    exact = {n for n in every if any(_matches(n, leaf) for leaf in leaves)} == set(chosen)
    # the leaf names when they select exactly these layers, else a regex of their full names
    targets: list[str] | str = leaves if exact else "|".join(map(re.escape, chosen))
    saved = sorted({names.get(m, m).rsplit(".", 1)[-1]
                    for m in spec.get("trainable", [])}) or None
    task = {"tokens": "TOKEN_CLS", "classify": "SEQ_CLS", "qa": "QUESTION_ANS"}.get(
        config.head, _TASK_TYPES.get(config.arch, "FEATURE_EXTRACTION"))
    fields = dict(base_model_name_or_path=base or None, task_type=task, modules_to_save=saved,
                  target_modules=targets, inference_mode=True, **_UNREAD)
    if spec["method"] == "lora":
        return dict(peft_type="LORA", r=spec["r"], lora_alpha=spec["alpha"],
                    lora_dropout=spec["dropout"], init_lora_weights=True,
                    fan_in_fan_out=config.extra.get("hf_model_type", _safe_type(config))
                    == "gpt2", **fields)
    return dict(peft_type=BOTTLENECK, size=spec["size"], activation=spec["activation"],
                **fields)


def _safe_type(config: ModelConfig) -> str | None:
    try:
        return default_type(config)
    except BadInput:
        return None


def load_adapter(model: nn.Module, folder: str | os.PathLike) -> nn.Module:
    """Add the adapters of a peft folder (made by attnlab or by peft) to ``model`` and load
    their weights, in place. Anything that does not fit the model (a layer it lacks, a shape
    that differs) is one error saying the adapter was made for another base model."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise MissingFile(f"{folder}: not an adapter folder (no {CONFIG_FILE})")
    if (folder / CONFIG_FILE).stat().st_size > MAX_CONFIG_BYTES:
        raise BadInput(f"{folder / CONFIG_FILE}: larger than {MAX_CONFIG_BYTES} bytes, not an "
                       "adapter config")
    cfg = read_json(folder / CONFIG_FILE, "adapter config")
    kind = cfg.get("peft_type")
    if kind not in ("LORA", BOTTLENECK):
        raise UnsupportedFormat(f"{folder / CONFIG_FILE}: peft_type={kind!r} is not supported "
                                f"(LORA, {BOTTLENECK})")
    for name, default in _UNREAD.items():
        if cfg.get(name) not in (None, default):
            raise UnsupportedFormat(f"{folder / CONFIG_FILE}: {name}={cfg[name]!r} is not "
                                    "supported")
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except FileNotFoundError:
        raise MissingFile(f"{folder / WEIGHTS_FILE}: missing") from None
    except (SafetensorError, OSError) as e:
        raise BadInput(f"{folder / WEIGHTS_FILE}: not a readable safetensors file ({e})") \
            from None
    ours = {t: o for o, t in module_names(model.config).items()}
    ours_params = {t: o for o, t in parameter_names(model.config).items()}
    family = FAMILIES.get(model.config.extra.get("hf_model_type") or _safe_type(model.config)
                          or "")
    alternatives = family.alternatives if family and ours else (lambda n: [])
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    lora = kind == "LORA"
    parts = ("lora_A", "lora_B") if lora else ("adapter_down", "adapter_up")
    layer_weights: dict[str, dict[str, torch.Tensor]] = {}
    head_weights: dict[str, torch.Tensor] = {}

    def own(name: str, table: dict[str, str], known) -> str | None:
        for n in [name, *alternatives(name)]:
            if n in table:
                return table[n]
        return name if name in known else None

    for key, tensor in tensors.items():
        name = key.removeprefix(PREFIX)
        match = re.fullmatch(rf"(.+)\.({'|'.join(parts)})\.(weight|bias)", name)
        if match:
            path = own(match[1], ours, modules)
            if path is None or not hasattr(modules[path], "out_features"):
                raise BadInput(f"{folder}: adapter weight {key!r} names a layer this base model "
                               "does not have: the adapter was made for a different base model")
            layer_weights.setdefault(path, {})[f"{match[2]}.{match[3]}"] = tensor
        else:
            param = own(name, ours_params, params)
            if param is None:
                raise BadInput(f"{folder}: adapter weight {key!r} matches no parameter of this "
                               "base model: the adapter was made for a different base model")
            head_weights[param] = tensor
    if not layer_weights:
        raise BadInput(f"{folder / WEIGHTS_FILE}: holds no adapter weights")
    spec: dict[str, Any] = {"method": "lora" if lora else "bottleneck",
                            "modules": sorted(layer_weights, key=list(modules).index),
                            "trainable": sorted({p.rsplit(".", 1)[0] for p in head_weights}),
                            "targets": []}
    try:
        if lora:
            spec.update(r=int(cfg["r"]), alpha=float(cfg["lora_alpha"]),
                        dropout=float(cfg.get("lora_dropout", 0.0)))
        else:
            spec.update(size=int(cfg["size"]), activation=cfg.get("activation", "relu"))
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"{folder / CONFIG_FILE}: missing or invalid field {e}") from None
    check_adapter(spec, str(folder / CONFIG_FILE))
    # every tensor named and shaped as the base model needs, before any adapter is made (a
    # rank in the config allocates nothing until the file's tensors agree with it)
    for path, found in layer_weights.items():
        _check_layer(folder, path, modules[path], found, spec)
    for param in head_weights:
        if any(param.startswith(f"{path}.") for path in layer_weights):
            raise BadInput(f"{folder}: {param} is both adapted and saved in full")
    adapt(model, spec)
    _load_into(model, folder, layer_weights, head_weights)
    return model


def _check_layer(folder: Path, path: str, layer: nn.Module, found: dict[str, torch.Tensor],
                 spec: dict[str, Any]) -> None:
    """The tensors one adapted layer needs, by name and shape: LoRA's ``A (r, in)`` and
    ``B (out, r)``; a bottleneck's ``down (size, out)`` and ``up (out, size)`` with biases."""
    i, o = layer.in_features, layer.out_features
    if spec["method"] == "lora":
        r = spec["r"]
        need = {"lora_A.weight": (r, i), "lora_B.weight": (o, r)}
    else:
        m = spec["size"]
        need = {"adapter_down.weight": (m, o), "adapter_down.bias": (m,),
                "adapter_up.weight": (o, m), "adapter_up.bias": (o,)}
    if set(found) != set(need):
        missing, extra = sorted(set(need) - set(found)), sorted(set(found) - set(need))
        raise BadInput(f"{folder / WEIGHTS_FILE}: layer {path} "
                       + (f"lacks {', '.join(missing)}" if missing
                          else f"has unexpected {', '.join(extra)}"))
    for name, shape in need.items():
        if tuple(found[name].shape) != shape:
            raise BadInput(f"{folder}: adapter weight for {path}.{name} is "
                           f"{tuple(found[name].shape)} but this base model and the config need "
                           f"{shape}: the adapter was made for a different base model")


def _load_into(model: nn.Module, folder: Path, layer_weights, head_weights) -> None:
    """Copy the tensors in, each checked against the shape the base model gives it."""
    layers, params = adapters(model), dict(model.named_parameters())
    for path, found in layer_weights.items():
        state = layers[path].state_dict()
        for name, tensor in found.items():
            _copy(state[name], tensor, f"{path}.{name}", folder)
    for name, tensor in head_weights.items():
        _copy(params[name].data, tensor, name, folder)


def _copy(target: torch.Tensor, tensor: torch.Tensor, name: str, folder: Path) -> None:
    if tuple(target.shape) != tuple(tensor.shape):
        raise BadInput(f"{folder}: adapter weight for {name} is {tuple(tensor.shape)} but this "
                       f"base model needs {tuple(target.shape)}: the adapter was made for a "
                       "different base model")
    with torch.no_grad():
        target.copy_(tensor.to(target.dtype))
