"""Hugging Face folders (``config.json`` + ``model.safetensors``) to and from attnlab models.

Each supported ``model_type`` is a :class:`Family`: how its config maps to a
:class:`~attnlab.ModelConfig`, and a table of weight names (per layer ``{i}``) with an optional
transpose (GPT-2 stores its projections as ``Conv1D``, i.e. ``(in, out)``). Loading reads only
safetensors — never a pickle — and nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from attnlab.config import POOLED_HEADS, ModelConfig, check_token_id
from attnlab.errors import BadInput, MissingFile
from attnlab.files import read_json


@dataclass
class Family:
    model_type: str
    # the transformers class written to config.json "architectures" (may depend on the head)
    hf_class: str | Callable[[ModelConfig], str]
    to_config: Callable[[dict], ModelConfig]
    from_config: Callable[[ModelConfig], dict]
    # (ours, theirs, how stored): False as is, True transposed, "row" a vector kept as (1, n)
    weights: Callable[[ModelConfig], list[tuple[str, str, bool | str]]]
    # other names a checkpoint may use for a weight (e.g. with or without a "bert." prefix)
    alternatives: Callable[[str], list[str]] = lambda name: []

    def class_name(self, config: ModelConfig) -> str:
        return self.hf_class if isinstance(self.hf_class, str) else self.hf_class(config)


FAMILIES: dict[str, Family] = {}

# transformers' activation names -> attnlab's, for every family (gelu_new and
# gelu_pytorch_tanh are GELU's tanh approximation; swish is SiLU), and back.
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
TO_HF_ACTIVATION = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


def activation_from_hf(hf: dict, field: str, default: str, family: str) -> str:
    """attnlab's name for the activation a config.json names in ``field``."""
    name = hf.get(field, default)
    if name not in HF_ACTIVATIONS:
        raise BadInput(f"{field}={name!r} is not supported for {family} "
                       f"(supported: {sorted(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[name]


def activation_to_hf(config: ModelConfig, family: str) -> str:
    """transformers' name for ``config.activation``."""
    if config.activation not in TO_HF_ACTIVATION:
        raise BadInput(f"activation={config.activation!r} has no {family} equivalent")
    return TO_HF_ACTIVATION[config.activation]


def require(c: ModelConfig, cls: str, **expected) -> None:
    """A one-line BadInput naming the first field of ``c`` that ``cls`` cannot store: each
    keyword is a field and the value it must have (or a predicate it must pass). Every family's
    writer checks this first, so a model is never saved as a family that would drop a part."""
    for name, want in expected.items():
        have = getattr(c, name)
        if not (want(have) if callable(want) else have == want):
            raise BadInput(f"{name}={have!r} has no {cls} equivalent")


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    return family


def read_hf_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.exists():
        raise MissingFile(f"{path}: not found (expected a Hugging Face model folder)")
    return read_json(path)


# the special token ids a family may read from config.json
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                   "unk_token_id")


def checked_token_ids(hf: dict) -> dict:
    """``hf`` with its special token ids checked, before a family reads them: null or absent
    (the family's default), a token id of the model's vocabulary (below ``vocab_size``, or
    the decoder's where it is larger), or a list of them (Llama 3's several eos ids). A
    negative ``pad_token_id`` means none, as early Llama conversions write it (-1); any other
    id out of range is one ``BadInput`` naming the field. transformers' GPT2Config writes
    bos = eos = 50256 over any vocab_size; such an id is refused here, because the model could
    never emit it and embedding it (a bos or a pad) reads past the table."""
    hf = dict(hf)
    sizes = [hf.get(k) for k in ("vocab_size", "decoder_vocab_size")]
    sizes = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    vocab = max(sizes) if sizes else None
    for field in TOKEN_ID_FIELDS:
        value = hf.get(field)
        if field == "pad_token_id" and isinstance(value, int) and value < 0:
            hf[field] = None
        elif isinstance(value, list):
            if not value:  # a family would read its first id
                raise BadInput(f"{field}=[]: expected a token id or a list of them")
            for item in value:
                check_token_id(item, vocab, field)
        elif value is not None:
            check_token_id(value, vocab, field)
    return hf


def family_of(hf: dict, folder: Path) -> Family:
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise BadInput(f"{folder / 'config.json'}: model_type={model_type!r} is not supported "
                       f"(supported: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[model_type]


def hf_weight_files(folder: Path) -> list[Path]:
    """``model.safetensors``, or the shards that ``model.safetensors.index.json`` names."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))
                                ["weight_map"].values()))
        except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as e:
            raise BadInput(f"{index}: not a safetensors index ({e})") from None
        files = [folder / str(s) for s in shards]
        for f in files:
            if f.parent != folder or not f.is_file():
                raise MissingFile(f"{index}: names a shard {f.name!r} that is not in {folder}")
        return files
    raise MissingFile(f"{folder}: no model.safetensors (pickled .bin files are not "
                      "loaded: they can run arbitrary code)")


def read_hf_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files."""
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise BadInput(f"{f}: truncated or corrupted safetensors file ({e})") from None
    return weights


def check_hf_weights(family: Family, config: ModelConfig, files: list[Path],
                     folder: Path) -> None:
    """The checkpoint's size and every tensor's shape against the config, before loading."""
    from attnlab import build

    model = build.checked_skeleton(config, folder / "config.json",
                                   sum(f.stat().st_size for f in files))
    ours_shapes = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    found = build.safetensors_shapes(files)
    tied = _tied_names(model)
    for ours, theirs, transform in layer_rows(family.weights(config), config):
        shape = ours_shapes[ours]
        expect = (1, *shape) if transform == "row" else shape[::-1] if transform else shape
        name = next((n for n in [theirs, *family.alternatives(theirs)] if n in found), None)
        if name is None:
            if ours in tied:
                continue  # stored once, as the embedding
            raise BadInput(f"{folder}: weight {theirs!r} missing from the checkpoint")
        if found[name] != tuple(expect):
            raise BadInput(f"{folder}: weight {name!r} is {found[name]} in the checkpoint but "
                           f"{tuple(expect)} in the model its config.json describes")


def layer_rows(table, config: ModelConfig):
    """The table with each per-layer row repeated for every layer of its stack."""
    for ours, theirs, transpose in table:
        if "{i}" in ours:
            n_layers = (config.n_encoder_layers if ours.startswith("encoder.") else
                        config.n_decoder_layers if ours.startswith("decoder.") else
                        config.n_decoder_layers or config.n_encoder_layers)
            for i in range(n_layers):
                yield ours.format(i=i), theirs.format(i=i), transpose
        else:
            yield ours, theirs, transpose


def from_pretrained(path: str | os.PathLike) -> nn.Module:
    """Load a local Hugging Face folder (or a Llama ``.gguf`` file) into the matching attnlab
    model, in eval mode."""
    from attnlab.build import build_model

    if str(path).endswith(".gguf"):
        from attnlab.interop.gguf import load_gguf

        return load_gguf(path)[0]
    folder = Path(path)
    hf = read_hf_config(folder)
    family = family_of(hf, folder)
    try:
        config = family.to_config(checked_token_ids(hf))
    except KeyError as e:
        raise BadInput(f"{folder / 'config.json'}: missing field {e}") from None
    except (TypeError, ValueError) as e:  # the families say what; this says which file
        raise BadInput(f"{folder / 'config.json'}: {e}") from None
    files = hf_weight_files(folder)
    check_hf_weights(family, config, files, folder)
    weights = read_hf_weights(files)
    model = build_model(config)
    tied = _tied_names(model)
    state: dict[str, torch.Tensor] = {}
    for ours, theirs, transpose in layer_rows(family.weights(config), config):
        name = next((n for n in [theirs, *family.alternatives(theirs)] if n in weights), None)
        if name is None:
            if ours in tied:
                continue  # stored once, as the embedding
            raise BadInput(f"{folder}: weight {theirs!r} missing from the checkpoint")
        state[ours] = _to_ours(weights[name].float(), transpose)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise BadInput(f"{folder}: weights do not fit the model (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    return model.eval()


def _tied_names(model: nn.Module) -> set[str]:
    """Parameter names that are a second name for a tensor already listed (tied weights)."""
    first = {name for name, _ in model.named_parameters()}
    return {name for name, _ in model.named_parameters(remove_duplicate=False)} - first


def _to_ours(w: torch.Tensor, transform: bool | str) -> torch.Tensor:
    """``True``: stored transposed (GPT-2's Conv1D); ``"row"``: a vector stored as (1, n)."""
    if transform == "row":
        return w.reshape(-1)
    return w.t().contiguous() if transform else w


def _to_theirs(w: torch.Tensor, transform: bool | str) -> torch.Tensor:
    if transform == "row":
        return w[None]
    return w.t() if transform else w


def save_pretrained(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write a folder that ``transformers`` loads (config.json + model.safetensors)."""
    config: ModelConfig = model.config
    model_type = config.extra.get("hf_model_type") or default_type(config)
    family = FAMILIES[model_type]
    # the family's config first: it refuses what it cannot store, before anything is written
    hf = {"architectures": [family.class_name(config)], "model_type": model_type,
          **family.from_config(config)}
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    ours_state = model.state_dict()
    tied = _tied_names(model)
    out = {}
    for ours, theirs, transpose in layer_rows(family.weights(config), config):
        if ours in tied:
            continue
        if ours not in ours_state:  # a family's table the config's checks let through
            raise BadInput(f"this model has no {ours} for {family.class_name(config)}'s "
                           f"{theirs}")
        out[theirs] = _to_theirs(ours_state[ours].detach(), transpose).contiguous().clone()
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return folder


def default_type(config: ModelConfig) -> str:
    if config.arch == "decoder":
        if config.positional != "rope":
            return "gpt2"
        return "llama" if config.sliding_window is None else "mistral"
    if config.arch == "encoder":  # the knob each descendant alone turns
        if config.attention_window is not None:
            return "longformer"
        if config.position_offset:
            return "roberta"
        if config.share_layers:
            return "albert"
        if not config.type_vocab_size:
            return "distilbert"
        drops_pooler = not config.pooler and config.head in POOLED_HEADS
        if config.head == "discriminator" or config.embedding_size or drops_pooler:
            return "electra"
        return "bert"
    if config.arch == "encoder-decoder":
        return "t5" if config.positional == "relative" else "marian"
    if config.arch == "vision":
        return "vit"
    raise BadInput(f"no Hugging Face family known for arch={config.arch!r}")
