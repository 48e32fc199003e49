"""Where a model's parameters live when training spans several ranks: the tensor-parallel
table (which tensors are split, along which dim), the rules a split must meet, and the
parameter, gradient and optimizer memory of each rank under data, tensor and pipeline
parallelism (``attnlab info --parallel``). The trainer applies the same table and rules
(:mod:`attnlab.training.parallel`).

Counts come from a model's own parameters (built on the meta device, so shapes only), with a
tensor shared by several modules (tied weights) counted once per rank.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from attnlab.errors import BadInput

if TYPE_CHECKING:
    from attnlab.config import ModelConfig


# --- the tensor-parallel table ---------------------------------------------------------------
# Megatron-LM's plan, read by both the memory planner (parallel_memory) and the engine
# (attnlab.training.parallel.apply_tensor_parallel). Each row: the path of the modules it splits
# (a regular expression), then the dim along which each of their tensors is split over the tp
# ranks; a tensor no row names stays whole on every rank (embeddings, norms, the head).
# - attention: Q, K, V (or the fused QKV) by their output rows, dim 0 (h/N heads a rank, the
#   bias with them); the output projection by its input columns, dim 1 (its bias is added once,
#   after the all-reduce, so it stays whole);
# - feed-forward: W₁ and W₃ by their rows (d_ff/N units a rank), W₂ by its columns;
# - T5's relative-bias table (buckets, heads): by its head columns, dim 1.
_IN_LAYER = r"(?:blocks|encoder|decoder)\.layers\.\d+\."
TENSOR_PARALLEL: dict[str, dict[str, int]] = {
    _IN_LAYER + r"(?:self_attn|cross_attn)": {
        "q_proj.weight": 0, "q_proj.bias": 0, "k_proj.weight": 0, "k_proj.bias": 0,
        "v_proj.weight": 0, "v_proj.bias": 0, "qkv.weight": 0, "qkv.bias": 0,
        "out_proj.weight": 1},
    _IN_LAYER + r"ffn": {"w1.weight": 0, "w1.bias": 0, "w3.weight": 0, "w3.bias": 0,
                         "w2.weight": 1},
    r"(?:tgt_)?positional": {"embedding.weight": 1},
}
_ROWS = [(re.compile(pattern), tensors) for pattern, tensors in TENSOR_PARALLEL.items()]
_LAYER = re.compile(r"^(blocks|encoder|decoder)\.layers\.(\d+)\.")  # a pipeline stage's unit
STRATEGIES = ("ddp", "fsdp")  # how data-parallel ranks hold the model: copies, or shards
PIPELINED = ("decoder", "encoder")  # archs the pipeline engine splits into stages
ADAM_BYTES = 8  # Adam's two moments, m and v, in fp32 for every parameter


def tp_children(module_path: str) -> dict[str, int] | None:
    """The row of :data:`TENSOR_PARALLEL` for the module at ``module_path``: its tensors (a
    child layer's ``weight`` or ``bias``) and the dim each is split along; None if tensor
    parallelism leaves the module whole."""
    for pattern, tensors in _ROWS:
        if pattern.fullmatch(module_path):
            return tensors
    return None


def tp_dim(name: str) -> int | None:
    """The dim along which tensor parallelism splits the parameter ``name`` (a full name,
    ``decoder.layers.0.cross_attn.k_proj.weight``), or None when every rank holds it whole."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        tensors = tp_children(".".join(parts[:cut]))
        if tensors is not None:
            return tensors.get(".".join(parts[cut:]))
    return None


def tp_split(name: str) -> str:
    """How tensor parallelism holds the parameter ``name``: ``"column"`` (split along its rows,
    dim 0), ``"row"`` (split along its columns, dim 1) or ``"replicated"`` (:func:`tp_dim`)."""
    return {0: "column", 1: "row", None: "replicated"}[tp_dim(name)]


@dataclass(frozen=True)
class RankMemory:
    """Training memory of the largest rank for one layout of ``world`` processes on a mesh
    dp × tp × pp (dp = world / (tp·pp)); byte counts, exact for the model they were counted
    from. ``stage`` is the pipeline stage shown (the largest; 0 without a pipeline)."""

    layout: str  # e.g. "FSDP 2 × TP 2"
    strategy: str  # "ddp" (replicate over dp) or "fsdp" (shard over dp)
    world: int
    dp: int
    tp: int
    pp: int
    stage: int
    numel: int  # parameters (elements) held by the rank
    parameters: int  # bytes
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def pipeline_layers(config: ModelConfig) -> int:
    """L, the layers a pipeline splits: the decoder's (GPT) or the encoder's (BERT, ViT)."""
    return config.n_decoder_layers if config.arch == "decoder" else config.n_encoder_layers


def stage_sizes(n_layers: int, pp: int) -> list[int]:
    """Layers per stage: ⌊L/N⌋ or ⌈L/N⌉, the first L mod N stages one more, so the largest
    stage holds ⌈L/N⌉ layers and no stage is empty (pp ≤ L)."""
    return [n_layers // pp + (1 if s < n_layers % pp else 0) for s in range(pp)]


def _check_degrees(world: int, tp: int, pp: int, strategy: str) -> None:
    for flag, value in (("--world", world), ("--tp", tp), ("--pp", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInput(f"{flag} {value}: must be a whole number >= 1")
    if strategy not in STRATEGIES:
        raise BadInput(f"--parallel {strategy}: expected one of {', '.join(STRATEGIES)}")


def check_layout(world: int, tp: int = 1, pp: int = 1, strategy: str = "ddp") -> None:
    """Raise :class:`BadInput`, one line naming the argument, unless the degrees are whole
    numbers ≥ 1, ``strategy`` is ddp or fsdp, and tp·pp divides ``world``."""
    _check_degrees(world, tp, pp, strategy)
    if world % (tp * pp):
        raise BadInput(f"--world {world} (processes): not divisible by tp·pp = {tp}·{pp} = "
                       f"{tp * pp}")


def check_parallel(config: ModelConfig, world: int, tp: int = 1, pp: int = 1,
                   strategy: str = "ddp") -> None:
    """Raise :class:`BadInput`, one line naming the argument, unless the model splits over
    ``world`` processes with ``tp``-way tensor and ``pp``-way pipeline parallelism: tp divides
    the heads h and the kv heads of every layer (a pruned layer keeps fewer); pp ≤ L, for a
    decoder-only or encoder-only model without shared layers; and tp·pp divides ``world``.
    (Which combinations the engine runs is :class:`attnlab.training.parallel.ParallelPlan`'s
    to say: PP alone, TP with FSDP.)"""
    _check_degrees(world, tp, pp, strategy)
    if config.n_heads % tp or config.kv_heads % tp:
        raise BadInput(f"--tp {tp}: must divide the model's {config.n_heads} attention heads "
                       f"and {config.kv_heads} kv heads (each rank holds h/N of them)")
    if tp > 1 and config.pruned_heads and config.positional == "relative":
        raise BadInput(f"--tp {tp}: T5's relative-bias table is split by the original heads, "
                       "which a pruned model no longer has in every layer")
    for layer, removed in (config.pruned_heads or {}).items():
        if (config.n_heads - len(removed)) % tp:
            raise BadInput(f"--tp {tp}: must divide the {config.n_heads - len(removed)} heads "
                           f"that pruning left in {layer}")
    if pp > 1 and config.arch not in PIPELINED:
        raise BadInput(f"--pp {pp}: only decoder-only and encoder-only language models are "
                       f"pipelined, not arch {config.arch!r}")
    if pp > 1 and config.share_layers:
        raise BadInput(f"--pp {pp}: layers that share one set of weights (share_layers, "
                       "ALBERT) are not pipelined")
    if pp > pipeline_layers(config):
        raise BadInput(f"--pp {pp}: more stages than the model's {pipeline_layers(config)} "
                       f"layers (each stage holds at least one)")
    check_layout(world, tp, pp, strategy)


def _local_numel(shape: tuple[int, ...], split: int | None, tp: int, shard: int) -> int:
    """Elements of one rank's piece of a tensor of ``shape``: split ``tp`` ways along dim
    ``split`` (None: whole), then FSDP's ``shard`` ways along dim 0. An uneven split gives the
    largest piece, ⌈n/N⌉ (torch.chunk; FSDP pads every shard to it)."""
    dims = list(shape) or [1]
    if split is not None:
        dims[split] = -(-dims[split] // tp)
    dims[0] = -(-dims[0] // shard)
    return math.prod(dims)


def parallel_memory(model: nn.Module, world: int, tp: int = 1, pp: int = 1,
                    strategy: str = "ddp", param_bytes: int = 4, grad_bytes: int | None = None,
                    optimizer_bytes: int = ADAM_BYTES,
                    config: ModelConfig | None = None) -> RankMemory:
    """Parameter, gradient and Adam memory of the largest of ``world`` ranks, counted from
    ``model``'s own parameters (build it on the meta device: shapes only) by their names, with
    tied weights once per rank. With dp = world / (tp·pp) and M the parameters:

    - DDP (``strategy="ddp"``): every dp rank holds all it has, M;
    - FSDP / ZeRO-3 (``"fsdp"``): parameters, gradients and optimizer state sharded over the
      dp ranks, each tensor along dim 0: ⌈rows/dp⌉ rows each, M/dp when dp divides the rows;
    - TP (``tp``): each tensor split as :data:`TENSOR_PARALLEL` says (q/k/v and FFN w1/w3 by
      rows, the attention output and w2 by columns), each rank h/tp heads and d_ff/tp units;
      embeddings, head, norms and the biases of the attention output and w2 whole;
    - PP (``pp``): ⌈L/pp⌉ layers per stage (:func:`stage_sizes`), the first stage with the
      embeddings, the last with the final norm and the head (a tied head is held by both
      stages); the largest stage is reported;
    - combined (FSDP × TP × PP): a stage's TP piece, then sharded over dp.

    Bytes per parameter: ``param_bytes`` for the weights (4: fp32), ``grad_bytes`` for the
    gradients (default: as the weights), ``optimizer_bytes`` for the optimizer state (8: Adam's
    two fp32 moments). The total is their sum: 4 + 4 + 8 = 16 bytes per parameter held in fp32
    (activations, buffers and communication buckets are not counted).
    """
    config = config if config is not None else model.config
    check_parallel(config, world, tp, pp, strategy)
    dp = world // (tp * pp)
    shard = dp if strategy == "fsdp" else 1
    named = list(model.named_parameters(remove_duplicate=False))
    stages: list[dict[int, int]] = [{} for _ in range(pp)]  # per stage: id(tensor) -> numel
    if pp == 1:
        layer_stage = None
    else:
        bounds = list(itertools.accumulate(stage_sizes(pipeline_layers(config), pp)))
        layer_stage = {i: bisect.bisect_right(bounds, i) for i in range(bounds[-1])}
    seen_layer = False
    for name, p in named:
        found = _LAYER.match(name)
        if layer_stage is None:
            stage = 0
        elif found:
            stage, seen_layer = layer_stage[int(found.group(2))], True
        else:  # embeddings before the first layer, the final norm and the head after the last
            stage = pp - 1 if seen_layer else 0
        stages[stage].setdefault(id(p), _local_numel(tuple(p.shape), tp_dim(name), tp, shard))
    totals = [sum(s.values()) for s in stages]
    largest = max(range(pp), key=totals.__getitem__)
    numel = totals[largest]
    grad = param_bytes if grad_bytes is None else grad_bytes
    return RankMemory(_layout(strategy, world, dp, tp, pp), strategy, world, dp, tp, pp,
                      largest, numel, numel * param_bytes, numel * grad, numel * optimizer_bytes)


def _layout(strategy: str, world: int, dp: int, tp: int, pp: int) -> str:
    """A layout's name: "single process", "DDP 4", "TP 2 × DDP 2", "FSDP 2 × TP 2 × PP 2"."""
    if world == 1:
        return "single process"
    parts = [f"TP {tp}"] * (tp > 1) + [f"PP {pp}"] * (pp > 1)
    if dp > 1:
        data = f"{strategy.upper()} {dp}"
        parts = [data, *parts] if strategy == "fsdp" or not parts else [*parts, data]
    return " × ".join(parts)


def parallel_rows(model: nn.Module, world: int, tp: int | None = None, pp: int | None = None,
                  config: ModelConfig | None = None, **sizes: int) -> tuple[list[RankMemory],
                                                                           list[str]]:
    """The layouts ``attnlab info --parallel`` compares, the ones the training engine runs, and
    a note for each one left out: one process; DDP and FSDP over all ``world`` ranks; TP N
    alone on N ranks (N = ``tp``, else ``world``); PP N alone on N ranks (N = ``pp``, else
    ``world``); and FSDP dp × TP tp over all, dp = world / tp > 1 (tp = ``tp``, else the
    largest tp < world that divides world and the heads). A ``tp`` or ``pp`` given that does
    not fit raises :class:`BadInput`; a default that does not fit only leaves its row out.
    ``sizes``: the byte sizes of :func:`parallel_memory`."""
    config = config if config is not None else model.config
    check_parallel(config, world, 1 if tp is None else tp, 1 if pp is None else pp)

    def row(**kwargs) -> RankMemory:
        return parallel_memory(model, config=config, **sizes, **kwargs)

    rows, notes = [row(world=1)], []
    if world > 1:
        rows += [row(world=world, strategy="ddp"), row(world=world, strategy="fsdp")]
    for flag, given in (("tp", tp), ("pp", pp)):
        n = world if given is None else given
        if n == 1:
            continue
        try:
            rows.append(row(world=n, **{flag: n}))
        except BadInput as e:
            if given is not None:
                raise
            reason = str(e).split(": ", 1)[-1]  # the message less its "--tp N: "
            notes.append(f"{flag.upper()} {n} not shown: {reason}")
    fits = [t for t in range(world - 1, 1, -1) if world % t == 0
            and config.n_heads % t == 0 and config.kv_heads % t == 0]
    t = tp if tp is not None else (fits[0] if fits else 1)
    if 1 < t < world:
        rows.append(row(world=world, tp=t, strategy="fsdp"))
    return rows, notes
