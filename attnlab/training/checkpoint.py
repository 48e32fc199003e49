"""Checkpoints that survive interruption and never unpickle arbitrary objects.

A checkpoint is a folder ``step-00001234/`` holding

* ``model.safetensors`` — the weights (tied weights stored once),
* ``config.json`` — the :class:`~attnlab.ModelConfig`,
* ``tokenizers.json`` — source and target tokenizers,
* ``trainer_state.pt`` — optimizer moments, RNG states, data position, step, schedule; loaded
  with ``torch.load(weights_only=True)``, which admits only tensors and plain containers.

Writes are atomic: everything goes into a temporary folder, each file is fsync'ed, and one
``rename`` publishes it, so a kill at any moment leaves either the old set of checkpoints or
the new one, never a half-written folder that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.config import ModelConfig

_STEP_DIR = re.compile(r"^step-(\d{8})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names the file."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1))


@contextmanager
def _contiguous_parameters(model: nn.Module):
    """safetensors writes only contiguous tensors; ``decoding_layout_`` leaves fp32 matrices
    transposed in memory. Make them contiguous for the write, then restore the layout."""
    moved = [(p, p.data) for p in model.parameters() if not p.is_contiguous()]
    for p, data in moved:
        p.data = data.contiguous()
    try:
        yield
    finally:
        for p, data in moved:
            p.data = data


def save_model_dir(final: str | os.PathLike, model: nn.Module, config: ModelConfig,
                   tokenizers: dict[str, dict], trainer_state: dict[str, Any] | None = None,
                   fault=None) -> Path:
    """Write a model folder atomically: a temporary sibling, fsync'ed, renamed into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with _contiguous_parameters(model):
        save_model(model, str(tmp / "model.safetensors"))
    if fault is not None:
        fault("checkpoint", trainer_state["step"])  # test hook: a kill mid-write
    config.to_json(tmp / "config.json")
    _write_json(tmp / "tokenizers.json", tokenizers)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer_state.pt")
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def save_checkpoint(root: str | os.PathLike, step: int, model: nn.Module, config: ModelConfig,
                    tokenizers: dict[str, dict], trainer_state: dict[str, Any] | None = None,
                    keep_last: int | None = None, fault=None) -> Path:
    """Write ``root/step-{step:08d}`` atomically; prune to the ``keep_last`` newest."""
    root = Path(root)
    final = save_model_dir(root / f"step-{step:08d}", model, config, tokenizers,
                           trainer_state, fault)
    if keep_last:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first (temporaries ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name))


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A checkpoint folder, or a run folder (its ``final`` model or newest checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model folder not found: {path}")
    if (path / "model.safetensors").exists():
        return path
    for candidate in (path / "final", path / "checkpoints"):
        if (candidate / "model.safetensors").exists():
            return candidate
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    raise FileNotFoundError(f"no model.safetensors in {path} or its checkpoints")


def read_config(folder: Path) -> ModelConfig:
    try:
        return ModelConfig.from_json(folder / "config.json")
    except FileNotFoundError:
        raise CheckpointError(f"{folder / 'config.json'}: missing from the checkpoint") from None


def load_weights(model: nn.Module, folder: str | os.PathLike) -> None:
    """Load ``model.safetensors`` into ``model``; a damaged file gives a CheckpointError."""
    path = Path(folder) / "model.safetensors"
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (SafetensorError, RuntimeError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: truncated or corrupted checkpoint ({e})") from None
    if unexpected or missing:
        raise CheckpointError(f"{path}: does not match the model (missing "
                              f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def load_trainer_state(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / "trainer_state.pt"
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as e:  # any unpickling failure means damage, never code execution
        raise CheckpointError(f"{path}: truncated or corrupted checkpoint ({e})") from None


def average_checkpoints(folders: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights of several checkpoints (the paper averaged the last 5)."""
    from safetensors.torch import load_file

    total: dict[str, torch.Tensor] = {}
    for folder in folders:
        path = Path(folder) / "model.safetensors"
        try:
            weights = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: truncated or corrupted checkpoint ({e})") from None
        for name, tensor in weights.items():
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (t / len(folders)).float() for name, t in total.items()}


def load_model_dir(path: str | os.PathLike):
    """``(model, config, tokenizers)`` from a checkpoint or run folder, in eval mode."""
    from attnlab.models import build_model
    from attnlab.tokenizers import tokenizer_from_dict

    folder = resolve_model_dir(path)
    config = read_config(folder)
    model = build_model(config)
    load_weights(model, folder)
    tok_path = folder / "tokenizers.json"
    try:
        data = json.loads(tok_path.read_text())
        tokenizers = {side: tokenizer_from_dict(d) for side, d in data.items()}
    except FileNotFoundError:
        raise CheckpointError(f"{tok_path}: missing from the checkpoint") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{tok_path}: truncated or corrupted ({e})") from None
    return model.eval(), config, tokenizers


def write_average(run: str | os.PathLike, last: int = 5, out: str | os.PathLike | None = None):
    """Average the ``last`` newest checkpoints of a run into a model folder (default
    ``run/final``), which ``attnlab translate --model run`` then prefers."""
    if last < 1:  # ckpts[-0:] would silently average every checkpoint
        raise ValueError(f"average the last N >= 1 checkpoints, got {last}")
    ckpts = list_checkpoints(Path(run) / "checkpoints") or list_checkpoints(run)
    if not ckpts:
        raise FileNotFoundError(f"no checkpoints under {run}")
    chosen = ckpts[-last:]
    model, config, tokenizers = load_model_dir(chosen[-1])
    averaged = average_checkpoints(chosen)
    _, unexpected = model.load_state_dict(averaged, strict=False)
    # Tied weights are stored once under one of their names: check every tensor got a value.
    by_name = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(by_name[name]) for name in averaged if name in by_name}
    if unexpected or any(id(p) not in loaded for p in model.parameters()):
        raise CheckpointError(f"{chosen[-1]}: checkpoints do not match the model")
    out = Path(run) / "final" if out is None else Path(out)
    save_model_dir(out, model, config, {k: t.to_dict() for k, t in tokenizers.items()})
    return out, chosen

