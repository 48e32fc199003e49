"""Training beyond one device, on PyTorch's own engine, applied from outside a plain model.

One :class:`ParallelPlan`, built from the flags and the world size, decides the layout. The
ranks form a DeviceMesh ``(pp, dp, tp)``, tensor parallelism innermost (ranks next to each
other exchange the most):

* **data parallel** (``dp = world / (tp·pp)`` ranks): DDP replicates the model; FSDP2
  (``fully_shard`` per block, then the root) shards parameters, gradients and Adam state, so a
  rank holds about M / dp of them (ZeRO-3) and gathers one block's weights at a time.
* **tensor parallel** (``--tp N``, Megatron-LM): in every attention the query/key/value
  projections are split column-wise and the output projection row-wise, so a rank computes
  h / N heads and one all-reduce joins them; the FFN's W₁ (and W₃) column-wise, W₂ row-wise.
  Embeddings, head and norms are replicated.
* **pipeline parallel** (``--pp N``): at most ⌈L / N⌉ layers per stage, micro-batches
  through a GPipe or 1F1B schedule (:mod:`attnlab.training.stages`); a bubble leaves the
  efficiency at B / (B + N − 1) for B micro-batches.
* **activation checkpointing** (:mod:`attnlab.training.recompute`), applied first: a
  checkpointed block keeps only its input and recomputes its inside during backward (memory
  ÷ a constant, time × (1 + α), α ≈ 0.2–0.3); segments of about √N blocks keep √N inputs and
  one segment's inside: memory ∝ √N instead of N.

The trainer asks this module for the data-parallel group (data is split and tokens are summed
over it, not over the whole world), for the gradient norm (over every shard and stage), and
for the full weights that rank 0 writes into each checkpoint's model folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab import hardware
from attnlab.errors import BadInput
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.placement import STRATEGIES, check_layout, check_parallel, tp_children
from attnlab.training import distributed
from attnlab.training.recompute import MODES, apply_checkpointing, layer_stacks
from attnlab.training.stages import SCHEDULES, Pipeline


@dataclass(frozen=True)
class ParallelPlan:
    """How ``world`` ranks share one training run (see the module docstring).

    ``strategy``: how the data-parallel ranks hold the model (``ddp``: whole copies; ``fsdp``:
    shards). ``tp``, ``pp``: tensor- and pipeline-parallel degrees; ``microbatches`` and
    ``schedule`` drive the pipeline. ``checkpointing``: ``none``, ``block`` or ``sqrt``.
    """

    world: int = 1
    strategy: str = "ddp"
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "gpipe"
    checkpointing: str = "none"

    def __post_init__(self) -> None:
        check_layout(self.world, self.tp, self.pp, self.strategy)
        for name, value, allowed in (("--activation-checkpointing", self.checkpointing, MODES),
                                     ("--pp-schedule", self.schedule, tuple(SCHEDULES))):
            if value not in allowed:
                raise BadInput(f"{name} {value!r}: expected one of {', '.join(allowed)}")
        if self.microbatches < 1:
            raise BadInput(f"--microbatches {self.microbatches}: must be a whole number >= 1")
        if self.tp > 1 and self.dp > 1 and self.strategy != "fsdp":
            raise BadInput(f"--tp {self.tp} on {self.world} processes leaves {self.dp} "
                           "data-parallel ranks: shard them with --parallel fsdp (a 2-D mesh)")
        if self.pp > 1 and (self.tp > 1 or self.dp > 1 or self.strategy == "fsdp"):
            raise BadInput(f"--pp {self.pp} runs on exactly {self.pp} processes, without --tp, "
                           f"--parallel fsdp or data parallelism (torchrun started "
                           f"{self.world})")
        if self.pp > 1 and self.schedule == "1f1b" and self.microbatches < self.pp:
            raise BadInput(f"--microbatches {self.microbatches} for --pp {self.pp}: the 1f1b "
                           "schedule needs at least one micro-batch per stage")
        if self.checkpointing == "sqrt" and self.sharded:
            raise BadInput("--activation-checkpointing sqrt runs in one process or under DDP; "
                           "with --parallel fsdp, --tp or --pp use block")

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def sharded(self) -> bool:
        """Whether some rank holds only part of the model (checkpoints are then sharded)."""
        return self.strategy == "fsdp" or self.tp > 1 or self.pp > 1

    def check(self, config) -> None:
        """The model can be split as asked (:func:`attnlab.placement.check_parallel`, the same
        rules ``attnlab info --parallel`` applies): N divides the heads and the key/value
        heads, so every attention keeps whole heads; ``pp`` stages for at most as many
        layers, of a decoder-only or encoder-only model."""
        check_parallel(config, self.world, self.tp, self.pp, self.strategy)


def from_environment(strategy: str | None = None, tp: int = 1, pp: int = 1,
                     microbatches: int | None = None, schedule: str | None = None,
                     checkpointing: str = "none", precision: str = "fp32",
                     compile: bool = False) -> ParallelPlan:
    """The plan for this process: ``strategy`` None means DDP when torchrun started several
    processes. ``precision`` is the resolved one (``fp32``, ``bf16`` or ``fp16``). Refused,
    each in one line: a parallel flag outside torchrun (the run would silently train alone),
    pipeline options without ``--pp``, a pipeline with fp16 (its loss scaling would have to
    span the stages) or ``--compile``, and fp16 with TP outside FSDP."""
    started = distributed.launched() or distributed.is_distributed()
    if not started and (strategy is not None or tp > 1 or pp > 1):
        flag = f"--parallel {strategy}" if strategy else ("--tp" if tp > 1 else "--pp")
        raise BadInput(f"{flag} needs several processes: launch with torchrun "
                       "(e.g. torchrun --standalone --nproc-per-node 2 -m attnlab.cli train ...)")
    if pp == 1:
        for flag, value in (("--microbatches", microbatches), ("--pp-schedule", schedule)):
            if value is not None:
                raise BadInput(f"{flag} needs --pp N (a pipeline of N stages)")
    elif precision == "fp16" or compile:
        raise BadInput(f"--pp runs in fp32 or bf16, without --compile (got --precision "
                       f"{precision}{' --compile' if compile else ''})")
    if tp > 1 and precision == "fp16" and strategy != "fsdp":
        # sharded and plain gradients side by side: torch's scalers unscale one kind at a time
        raise BadInput("--precision fp16 with --tp needs --parallel fsdp (or use bf16 or fp32)")
    if distributed.is_distributed():  # a process group already started (by torchrun or not)
        world = distributed.rank_and_world()[1]
    else:
        world = int(os.environ["WORLD_SIZE"]) if distributed.launched() else 1
    return ParallelPlan(world, strategy or "ddp", tp, pp,
                        microbatches if microbatches is not None else max(1, 2 * pp),
                        schedule or "gpipe", checkpointing)


# --- the mesh --------------------------------------------------------------------------------
class RankMesh:
    """This rank's place in the plan's mesh: its data-parallel group and rank, its tensor- and
    pipeline-parallel groups, and the sub-meshes the engine's APIs take."""

    def __init__(self, plan: ParallelPlan, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh

        self.plan = plan
        self.mesh = None
        self.dp_rank, self.dp_group = 0, None
        self.pp_rank, self.pp_group = 0, None
        self.tp_rank = 0
        if not (dist.is_available() and dist.is_initialized()):
            return
        self.mesh = init_device_mesh(device.type, (plan.pp, plan.dp, plan.tp),
                                     mesh_dim_names=("pp", "dp", "tp"))
        self.dp_rank, self.dp_group = self.mesh["dp"].get_local_rank(), self.mesh["dp"].get_group()
        self.pp_rank, self.pp_group = self.mesh["pp"].get_local_rank(), self.mesh["pp"].get_group()
        self.tp_rank = self.mesh["tp"].get_local_rank()

    def submesh(self, *names: str):
        return self.mesh[names if len(names) > 1 else names[0]]


@dataclass
class Placed:
    """A model laid out by a plan: ``trained`` holds the parameters this rank's optimizer
    updates (a pipeline stage's part, or the whole, possibly sharded, model); ``train_model``
    is what the training step calls (DDP's wrapper under plain data parallelism);
    ``autocast`` the precision autocast runs in (fp32 under FSDP, whose
    ``MixedPrecisionPolicy`` casts instead)."""

    layout: RankMesh
    trained: nn.Module
    train_model: nn.Module
    pipeline: object | None
    autocast: str


def place(model: nn.Module, task, plan: ParallelPlan, device: torch.device,
          precision: str) -> Placed:
    """Apply ``plan`` to ``model`` in place, in the order the engine needs: activation
    checkpointing, then either the pipeline split, or tensor parallelism and then FSDP over
    the data-parallel ranks (a 2-D mesh with both); under plain data parallelism, DDP."""
    layout = RankMesh(plan, device)
    autocast = "fp32" if plan.strategy == "fsdp" else precision
    apply_checkpointing(model, plan.checkpointing)
    if plan.pp > 1:
        pipeline = Pipeline(model, task, layout.pp_rank, plan.pp, layout.pp_group,
                            plan.microbatches, plan.schedule, device)
        return Placed(layout, pipeline.module, pipeline.module, pipeline, autocast)
    if plan.tp > 1:
        apply_tensor_parallel(model, layout)
    if plan.strategy == "fsdp":
        apply_fsdp(model, layout, precision)
    train_model = model if plan.sharded else distributed.wrap(model)
    return Placed(layout, model, train_model, None, autocast)


def grad_scaler(plan: ParallelPlan, device: torch.device, precision: str):
    """fp16's loss scaler (None otherwise); with FSDP or TP torch's sharded one, whose inf
    check spans the ranks (a rank whose shard overflowed must not step alone)."""
    if precision != "fp16" or not plan.sharded:
        return hardware.grad_scaler(device, precision)
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device.type, init_scale=2.0**15)


# --- tensor parallelism ----------------------------------------------------------------------
def apply_tensor_parallel(model: nn.Module, layout: RankMesh) -> None:
    """Megatron's plan, :data:`attnlab.placement.TENSOR_PARALLEL` (the table the memory
    planner reads too), through ``parallelize_module``: every module the table names has the
    layers it lists split, a layer whose weight is split by output features
    (``ColwiseParallel``: Q, K, V, W₁, W₃, and T5's relative-bias embedding by its head
    columns) or by input features (``RowwiseParallel``: the attention output, W₂). An
    attention's fused QKV matrix is first split into its three projections, so each is sharded
    by heads, and the module then computes its rank's heads ``[r·h/N, (r+1)·h/N)``."""
    from torch.distributed.tensor.parallel import parallelize_module

    n, rank, mesh = layout.plan.tp, layout.tp_rank, layout.submesh("tp")
    for path, module in list(model.named_modules()):
        tensors = tp_children(path)
        if tensors is None:
            continue
        if isinstance(module, MultiHeadAttention):
            module.unfuse_qkv_()
        styles = {child: _style(getattr(module, child), dim)
                  for child, dim in _weight_dims(tensors).items()
                  if getattr(module, child, None) is not None}
        parallelize_module(module, mesh, styles)
        if isinstance(module, MultiHeadAttention):
            # the module now sees only its rank's heads: (batch, seq, h/N · d_k)
            module.n_heads //= n
            module.num_kv_heads //= n
            module.q_dim, module.kv_dim = module.q_dim // n, module.kv_dim // n
            heads = module.n_heads
            module.original_heads = module.original_heads[rank * heads:(rank + 1) * heads]


def _weight_dims(tensors: dict[str, int]) -> dict[str, int]:
    """A table row's child layers and the dim each one's weight is split along."""
    return {name.removesuffix(".weight"): dim for name, dim in tensors.items()
            if name.endswith(".weight")}


def _style(layer: nn.Module, dim: int):
    """torch's style that splits ``layer``'s weight along ``dim``: an ``nn.Linear`` weight is
    (out, in), so dim 0 is ``ColwiseParallel`` (the bias split with it) and dim 1
    ``RowwiseParallel`` (the bias whole); an ``nn.Embedding`` is (rows, features), split by its
    features under ``ColwiseParallel``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    features = 1 if isinstance(layer, nn.Embedding) else 0
    return ColwiseParallel() if dim == features else RowwiseParallel()


def fused_state(state: dict[str, Tensor], config) -> dict[str, Tensor]:
    """A full state dict of a tensor-parallel model, its attention projections put back into
    the fused ``qkv`` rows ``[Q | K | V]`` the config's model has (the inverse of
    :meth:`MultiHeadAttention.unfuse_qkv_`)."""
    if not config.fused_qkv:
        return state
    out = dict(state)
    for key in [k for k in state if ".q_proj." in k]:
        prefix, _, kind = key.partition(".q_proj.")
        parts = [out.pop(f"{prefix}.{p}.{kind}") for p in ("q_proj", "k_proj", "v_proj")]
        out[f"{prefix}.qkv.{kind}"] = torch.cat(parts)
    return out


# --- FSDP2 -----------------------------------------------------------------------------------
def apply_fsdp(model: nn.Module, layout: RankMesh, precision: str) -> None:
    """``fully_shard`` each layer, then the root, over the data-parallel mesh (with ``--tp``,
    the dp dimension of the 2-D mesh). bf16 trains through FSDP's ``MixedPrecisionPolicy``:
    bf16 weights in compute, gradients reduced in fp32, fp32 master shards."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if precision in ("bf16", "fp16"):
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, {"bf16": "bfloat16",
                                                                  "fp16": "float16"}[precision]),
                                      reduce_dtype=torch.float32)
    mesh = layout.submesh("dp")
    for layers in layer_stacks(model):
        for layer in dict.fromkeys(layers):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


# --- gradients -------------------------------------------------------------------------------
def grad_norm(parameters, pp_group=None) -> Tensor:
    """‖g‖₂ over every gradient of the model, whichever rank holds it: sharded gradients
    (DTensors) are reduced over their own mesh by torch, grouped by mesh and placement; the
    stages of a pipeline add their squares. Replicated gradients count once."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list[Tensor]] = {}
    for p in parameters:
        if p.grad is None:
            continue
        g = p.grad
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    squares = torch.zeros((), dtype=torch.float32)
    for key, grads in groups.items():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if key is not None:
            norm = norm.full_tensor()
        squares = squares + norm.float().cpu() ** 2
    if pp_group is not None:
        squares = squares.to(distributed.group_device(pp_group))
        dist.all_reduce(squares, group=pp_group)
    return squares.cpu().sqrt()


def clip_grad_norm(parameters, max_norm: float, pp_group=None, counted=None) -> Tensor:
    """Scale every gradient by min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ from :func:`grad_norm`
    of ``counted`` (default: ``parameters``; a pipeline's second copy of a tied weight is left
    out) — ``torch.nn.utils.clip_grad_norm_``'s rule, over the whole model. Returns ‖g‖."""
    parameters = list(parameters)
    total = grad_norm(parameters if counted is None else counted, pp_group)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


__all__ = ["STRATEGIES", "SCHEDULES", "MODES", "ParallelPlan", "RankMesh", "Placed", "place",
           "grad_scaler", "from_environment", "apply_tensor_parallel", "apply_checkpointing",
           "apply_fsdp", "clip_grad_norm", "grad_norm", "fused_state"]
