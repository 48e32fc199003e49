"""What a training run is asked to do: :class:`TrainConfig` (length, batch, optimiser,
precision, validation and early stopping, how it spreads over devices) and the optimiser it
builds (:func:`build_optimizer`). The loop itself is :mod:`attnlab.training.trainer`."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from attnlab import hardware
from attnlab.config import check_at_least
from attnlab.errors import BadInput
from attnlab.training import parallel
from attnlab.training.schedule import NoamSchedule, schedule_to_dict


@dataclass
class TrainConfig:
    steps: int = 1000
    max_tokens: int = 4096  # padded tokens per side per micro-batch (the paper: ~25,000)
    accumulate: int = 1
    label_smoothing: float = 0.1
    clip_norm: float | None = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    schedule: dict[str, Any] = field(default_factory=lambda: schedule_to_dict(NoamSchedule()))
    # "fp32", "bf16", "fp16" or "auto" (attnlab.hardware decides for the device); the CLI
    # passes its --precision here. The library default stays fp32: same numbers everywhere.
    precision: str = "fp32"
    device: str = "auto"  # where recipes build the model: auto, cpu, cuda[:N], mps
    compile: bool = False
    seed: int = 0
    save_every: int = 500
    keep_last: int = 5
    log_every: int = 10
    optimizer: str = "adam"  # "adamw": decoupled weight decay on matrices only
    weight_decay: float = 0.0
    eval_every: int = 0  # steps between validation passes (0: never)
    patience: int = 0  # stop after this many validation passes without a better loss (0: never)
    time_budget: float | None = None  # seconds of training, then stop cleanly
    # stop at the first validation pass this accurate (a task that classifies); with early
    # stopping on, that model is the one kept in best/
    stop_at_accuracy: float | None = None
    progress: bool = True
    # beyond one device (attnlab.training.parallel): None = DDP when torchrun starts several
    # processes; "fsdp" shards; tp / pp: tensor- and pipeline-parallel degrees
    parallel: str | None = None
    tp: int = 1
    pp: int = 1
    microbatches: int | None = None  # pipeline micro-batches (default 2 x pp)
    pp_schedule: str | None = None  # gpipe (the default) or 1f1b
    activation_checkpointing: str = "none"  # none, block or sqrt

    def plan(self) -> parallel.ParallelPlan:
        """The layout these fields ask for, in the processes torchrun started."""
        precision = hardware.pick_precision(self.precision, self.device_for_memory,
                                            warn=False)
        return parallel.from_environment(self.parallel, self.tp, self.pp, self.microbatches,
                                         self.pp_schedule, self.activation_checkpointing,
                                         precision, self.compile)

    @property
    def parallel_asked(self) -> bool:
        """Whether a flag asks for FSDP, TP or PP (these need a process group even on one
        rank)."""
        return self.parallel is not None or self.tp > 1 or self.pp > 1

    @property
    def device_for_memory(self):
        """The device training runs on, for memory checks (``auto`` resolved)."""
        return hardware.pick_device(self.device)

    def __post_init__(self) -> None:
        check_at_least(self, dict(steps=1, max_tokens=1, accumulate=1, save_every=1, keep_last=1,
                                  log_every=1, eval_every=0, patience=0, weight_decay=0.0,
                                  label_smoothing=0.0, clip_norm=0.0, eps=0.0))
        if self.time_budget is not None and not self.time_budget > 0:
            raise BadInput(f"time_budget must be > 0 seconds, got {self.time_budget!r}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise BadInput(f"stop_at_accuracy must be in (0, 1], got {self.stop_at_accuracy!r}")
        if not self.label_smoothing < 1:
            raise BadInput(f"label_smoothing must be < 1, got {self.label_smoothing!r}")
        hardware.precision_name(self.precision)  # an unknown name is a named error here
        self.steps = _capped(self.steps)


def _capped(steps: int) -> int:
    """``steps``, or fewer under ``ATTNLAB_MAX_STEPS=N`` (a smoke test of a recipe: the README's
    commands run in the test suite so), with a warning saying so."""
    cap = os.environ.get("ATTNLAB_MAX_STEPS", "")
    if not cap:
        return steps
    if not cap.isdigit() or int(cap) < 1:
        raise BadInput(f"ATTNLAB_MAX_STEPS={cap!r}: expected a whole number >= 1")
    if steps > int(cap):
        warnings.warn(f"ATTNLAB_MAX_STEPS={cap}: training stops at step {cap}, not {steps}",
                      stacklevel=3)
        return int(cap)
    return steps


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float,
                    fused: bool = True) -> torch.optim.Optimizer:
    """Adam (the paper) or AdamW with weight decay on matrices only: biases, norm gains and
    embeddings' 1-D parameters are not pulled towards zero. ``fused=False`` keeps to the
    per-tensor kernels (FSDP's sharded fp16 scaler hands the fused one a step flag of the
    wrong shape)."""
    params = list(model.parameters())
    # The fused kernel updates every tensor in one pass: on CPU a small GPT's AdamW step drops
    # from 1.7 ms to 0.4 ms (5% of its training step).
    fused = fused and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                          for p in params)
    # Tensor parallelism leaves some parameters plain (norms, embeddings) beside sharded
    # DTensors; the fused and foreach kernels take one kind per call, so update per tensor.
    mixed = len({isinstance(p, DTensor) for p in params}) > 1
    kernels = dict(fused=False, foreach=False) if mixed else dict(fused=fused)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, betas=cfg.betas, eps=cfg.eps, **kernels)
    if cfg.optimizer != "adamw":
        raise BadInput(f"unknown optimizer {cfg.optimizer!r} (adam or adamw)")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, eps=cfg.eps, **kernels)


__all__ = ["TrainConfig", "build_optimizer"]
