"""Training checkpoints that survive interruption and never unpickle arbitrary objects.

A checkpoint is a model folder (:func:`attnlab.storage.save_model_dir`: safetensors weights,
``config.json``, ``tokenizers.json``, written atomically) named ``step-00001234/``, plus

* ``trainer_state.pt`` — optimizer moments, RNG states, data position, step, schedule; loaded
  with ``torch.load(weights_only=True)``, which admits only tensors and plain containers.

A kill at any moment leaves either the old set of checkpoints or the new one, never a
half-written folder that looks complete.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput, MissingFile
from attnlab.storage import (
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_model_dir,
    load_state,
    save_model_dir,
)


def save_checkpoint(root: str | os.PathLike, step: int, model: nn.Module, config: ModelConfig,
                    tokenizers: dict[str, dict], trainer_state: dict[str, Any] | None = None,
                    keep_last: int | None = None, fault=None,
                    extra_files: dict[str, Any] | None = None) -> Path:
    """Write ``root/step-{step:08d}`` atomically; prune to the ``keep_last`` newest.
    ``fault(point, step)`` is the interruption tests' hook (a kill mid-write);
    ``extra_files`` name more parts, each a function writing it (a sharded run's shards)."""
    root = Path(root)
    extra = dict(extra_files or {})
    if trainer_state is not None:
        extra["trainer_state.pt"] = lambda path: torch.save(trainer_state, path)
    final = save_model_dir(root / f"step-{step:08d}", model, config, tokenizers, extra,
                           None if fault is None else lambda: fault("checkpoint", step))
    if keep_last:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


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
    total: dict[str, torch.Tensor] = {}
    for folder in folders:
        for name, tensor in load_state(Path(folder) / "model.safetensors").items():
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (t / len(folders)).float() for name, t in total.items()}


def write_average(run: str | os.PathLike, last: int = 5, out: str | os.PathLike | None = None):
    """Average the ``last`` newest checkpoints of a run into a model folder (default
    ``run/final``), which ``attnlab.load(run)`` then prefers; a run with fewer checkpoints
    is averaged over those it has, with a warning saying how many. Returns
    ``(folder, used)``, ``used`` the checkpoint folders averaged."""
    if last < 1:  # ckpts[-0:] would silently average every checkpoint
        raise BadInput(f"average the last N >= 1 checkpoints, got {last}")
    ckpts = list_checkpoints(Path(run) / "checkpoints") or list_checkpoints(run)
    if not ckpts:
        raise MissingFile(f"no checkpoints under {run}")
    chosen = ckpts[-last:]
    if len(chosen) < last:
        warnings.warn(f"asked for the last {last} checkpoints, {run} has only {len(chosen)}: "
                      f"averaged {len(chosen)}", stacklevel=2)
    model, config, tokenizers = load_model_dir(chosen[-1])
    averaged = average_checkpoints(chosen)
    _, unexpected = model.load_state_dict(averaged, strict=False)
    # Tied weights are stored once under one of their names: check every tensor got a value.
    by_name = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(by_name[name]) for name in averaged if name in by_name}
    if unexpected or any(id(p) not in loaded for p in model.parameters()):
        raise CheckpointError(f"{chosen[-1]}: checkpoints do not match the model")
    out = Path(run) / "final" if out is None else Path(out)
    save_model_dir(out, model, config, {k: t.to_dict() for k, t in tokenizers.items()},
                   step=checkpoint_step(chosen[-1]))
    return out, chosen
