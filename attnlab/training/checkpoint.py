"""Training checkpoints that survive interruption and never unpickle arbitrary objects.

A checkpoint is a model folder (:func:`attnlab.storage.save_model_dir`: safetensors weights,
``config.json``, ``tokenizers.json``, written atomically) in the run's ``checkpoints/``,
named ``step-00001234/`` (the run folder's rules are :mod:`attnlab.storage`'s), plus

* ``trainer_state.pt`` — optimizer moments, RNG states, data position, step, schedule; loaded
  with ``torch.load(weights_only=True)``, which admits only tensors and plain containers;
* ``sharded/``, for a run whose ranks each hold part of the model: every rank's shards of the
  model and the optimizer (:mod:`attnlab.training.sharded`), which only ``--resume`` reads.

A kill at any moment leaves either the old set of checkpoints or the new one, never a
half-written folder that looks complete.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput, MissingFile, WriteFailed
from attnlab.storage import (
    CHECKPOINTS,
    FINAL,
    CheckpointError,
    checkpoint_dir,
    checkpoint_step,
    list_checkpoints,
    load_model_dir,
    load_state,
    prune_checkpoints,
    save_model_dir,
)
from attnlab.training import distributed, sharded


def save_checkpoint(root: str | os.PathLike, step: int, model: nn.Module | None,
                    config: ModelConfig, tokenizers: dict[str, dict],
                    trainer_state: dict[str, Any] | None = None, keep_last: int | None = None,
                    fault: Callable[[str, int], None] | None = None,
                    shards: tuple[nn.Module, torch.optim.Optimizer] | None = None
                    ) -> Path | None:
    """Write step ``step``'s checkpoint under ``root`` atomically, then prune to the
    ``keep_last`` newest; a failed write names the last good one. Returns the folder.

    Plain (``shards`` None): call it on the one process that writes; ``model`` is the model.
    Sharded (``shards``: this rank's part of the model and its optimizer): a collective call.
    Every rank writes its shards into one temporary folder; then rank 0 writes the model
    folder of ``model`` (the gathered weights, a plain module; None on the other ranks) around
    them and renames it into place. Returns None on the other ranks.

    ``fault(point, step)`` is the interruption tests' hook (a kill mid-write)."""
    root = Path(root)

    def write(extra: dict[str, Callable[[Path], Any]]) -> Path:
        if trainer_state is not None:
            extra["trainer_state.pt"] = lambda path: torch.save(trainer_state, path)
        try:
            folder = save_model_dir(checkpoint_dir(root, step), model, config, tokenizers,
                                    extra, None if fault is None
                                    else lambda: fault("checkpoint", step))
        except WriteFailed as e:
            raise WriteFailed(f"{e}; training stopped at step {step}, last good checkpoint: "
                              f"{last_good(root)}") from None
        prune_checkpoints(root, keep_last)
        return folder

    if shards is None:
        return write({})
    written = sharded.write_shards(root, step, *shards)
    return distributed.from_main(
        lambda: write({sharded.SHARDED: lambda path: os.replace(written, path)}))


def last_good(root: str | os.PathLike) -> str:
    """The newest checkpoint under ``root``, for a message that training stopped."""
    found = list_checkpoints(root)
    return str(found[-1]) if found else "none written yet"


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
    ckpts = list_checkpoints(Path(run) / CHECKPOINTS) or list_checkpoints(run)
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
    out = Path(run) / FINAL if out is None else Path(out)
    save_model_dir(out, model, config, {k: t.to_dict() for k, t in tokenizers.items()},
                   step=checkpoint_step(chosen[-1]))
    return out, chosen
