"""What a training run is asked to do: :class:`TrainConfig` (length, batch, optimiser,
precision, validation and early stopping, how it spreads over devices) and the optimiser it
builds (:func:`build_optimizer`). The loop itself is :mod:`attnlab.training.trainer`."""

from __future__ import annotations

import os
import re
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
    # fine-tuning as the course teaches it: adapters over a frozen model (the request of
    # attnlab.interop.peft.adapter_spec: method, r, alpha, dropout, size, targets), each
    # layer's learning rate ξ times the one above (layer_decay = ξ; 1: one rate), and
    # progressive unfreezing (the top layer group first, one more every unfreeze_every steps)
    adapter: dict[str, Any] | None = None
    layer_decay: float = 1.0
    unfreeze_every: int = 0

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
        if not 0 < self.layer_decay <= 1:
            raise BadInput(f"layer_decay must be in (0, 1], got {self.layer_decay!r}")
        if self.unfreeze_every < 0:
            raise BadInput(f"unfreeze_every must be >= 0, got {self.unfreeze_every!r}")
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


_LAYER = re.compile(r"(?:^|\.)(encoder|decoder|blocks)\.layers\.(\d+)\.")


def layer_depths(model: nn.Module) -> dict[str, int]:
    """Each parameter's depth for discriminative learning rates and progressive unfreezing:
    layer l of a stack is l (1-based; the decoder's layers come above the encoder's), what
    comes before the first layer (the embeddings) is 0, and what comes after the last (final
    norms, pooler, task heads) is N + 1, the top."""
    config = model.config
    n_enc = config.n_encoder_layers
    top = n_enc + config.n_decoder_layers + 1
    depths, seen_layer = {}, False
    for name, _ in model.named_parameters():
        found = _LAYER.search(name)
        if found:
            seen_layer = True
            depths[name] = int(found[2]) + 1 + (n_enc if found[1] == "decoder" else 0)
        else:
            depths[name] = top if seen_layer else 0
    return depths


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float,
                    fused: bool = True) -> torch.optim.Optimizer:
    """Adam (the paper) or AdamW with weight decay on matrices only: biases, norm gains and
    embeddings' 1-D parameters are not pulled towards zero. Only the parameters that require
    gradients are optimised (a model with adapters: the adapters alone hold state). With
    ``layer_decay`` ξ < 1 or progressive unfreezing, one group per depth d (:func:`layer_depths`)
    records ``depth`` and ``lr_scale = ξ^(top − d)``, which the trainer multiplies the
    schedule's rate by. ``fused=False`` keeps to the per-tensor kernels (FSDP's sharded fp16
    scaler hands the fused one a step flag of the wrong shape)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    # The fused kernel updates every tensor in one pass, not one kernel per tensor: several
    # times quicker on a small model's many small tensors.
    fused = fused and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                          for p in params)
    # Tensor parallelism leaves some parameters plain (norms, embeddings) beside sharded
    # DTensors; the fused and foreach kernels take one kind per call, so update per tensor.
    mixed = len({isinstance(p, DTensor) for p in params}) > 1
    kernels = dict(fused=False, foreach=False) if mixed else dict(fused=fused)
    if cfg.optimizer not in ("adam", "adamw"):
        raise BadInput(f"unknown optimizer {cfg.optimizer!r} (adam or adamw)")
    decay = cfg.weight_decay if cfg.optimizer == "adamw" else 0.0
    by_depth = cfg.layer_decay != 1 or cfg.unfreeze_every
    depths = layer_depths(model) if by_depth else {n: 0 for n, _ in named}
    top = max(depths.values(), default=0)
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in named:
        matrix = p.dim() >= 2 and cfg.optimizer == "adamw"
        d = depths[name]
        group = groups.setdefault((d, matrix), {
            "params": [], "weight_decay": decay if matrix else 0.0, "depth": d,
            "lr_scale": cfg.layer_decay ** (top - d) if by_depth else 1.0})
        group["params"].append(p)
    optimizer = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return optimizer(list(groups.values()), lr=lr, betas=cfg.betas, eps=cfg.eps, **kernels)


__all__ = ["TrainConfig", "build_optimizer", "layer_depths"]
