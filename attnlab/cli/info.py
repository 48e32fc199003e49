"""``attnlab info``: a preset's architecture and parameter table, the detected hardware, or
(``--parallel``) each rank's training memory under DDP, FSDP, tensor and pipeline parallelism."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from attnlab.cli.common import UsageError, add_preset_args, preset_config

if TYPE_CHECKING:
    from attnlab.config import ModelConfig
    from attnlab.placement import RankMemory


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab import hardware
    from attnlab.build import build_model, parameter_breakdown

    _check_flags(args)
    if args.hardware:
        print("\n".join(hardware.describe(args.device)))
        return
    config = preset_config(args)
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        model = build_model(config)
    if args.parallel:
        print_parallel(args, config, model)
        return
    layers = {"encoder-decoder": f"{config.n_encoder_layers} encoder + "
                                 f"{config.n_decoder_layers} decoder",
              "decoder": f"{config.n_decoder_layers} (causal)",
              "encoder": f"{config.n_encoder_layers} (bidirectional)",
              "vision": f"{config.n_encoder_layers} (bidirectional)"}[config.arch]
    placement = {"post": "post-LN  x ← Norm(x + Sublayer(x))",
                 "pre": "pre-LN  x ← x + Sublayer(Norm(x))"}[config.norm_placement]
    rows = [
        ("architecture", config.arch),
        ("layers", layers),
        ("d_model", config.d_model),
        ("heads", f"{config.n_heads} (kv heads {config.kv_heads})"),
        ("d_k = d_v", config.d_k),
        ("d_ff", config.d_ff),
        ("dropout", f"{config.dropout} (attention {config.attention_dropout})"),
        ("positional encoding", config.positional),
        ("norm", f"{config.norm}, {placement}"),
        ("activation", config.activation),
        ("vocabulary", f"{config.vocab_size}" + (" shared" if config.tgt_vocab_size is None
                                                  else f" / {config.tgt_vocab_size}")),
        ("tied embeddings", config.tie_embeddings),
        ("max length", config.max_len),
    ]
    if config.share_layers:  # ALBERT: the parameter table counts the one layer once
        layers += ", one layer's weights shared by all"
        rows[1] = ("layers", layers)
    if config.rope_scaling:
        rows.insert(8, ("rope scaling", ", ".join(f"{k} {v}" for k, v in
                                                  config.rope_scaling.items())))
    if config.sliding_window is not None:  # Mistral
        rows.insert(8, ("sliding window", f"{config.sliding_window} (query i sees keys "
                                          f"i - {config.sliding_window} < j <= i)"))
    if config.arch == "encoder":
        rows += [("segment types", config.type_vocab_size), ("pooler", config.pooler),
                 ("head", config.head)]
        if config.embedding_size:
            rows.append(("embedding size", f"{config.embedding_size} (projected to "
                                           f"{config.d_model})"))
        if config.position_offset:  # RoBERTa
            rows.append(("first position", f"{config.position_offset} (pads take "
                                           f"{config.pad_id})"))
    if config.arch == "vision":  # pixels, not a vocabulary: the image and its patches instead
        side, p = config.image_size, config.patch_size
        rows = [r for r in rows if r[0] not in ("vocabulary", "tied embeddings", "max length")]
        rows += [("image", f"{config.num_channels} x {side} x {side}"),
                 ("patches", f"{config.n_patches} of {p} x {p} (+ [CLS])"),
                 ("head", f"{config.head} ({config.num_labels} labels)")]
    print(f"preset {args.preset}")
    for key, value in rows:
        print(f"  {key:<20} {value}")
    print("\nparameters")
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<20} {count:>13,}  ({count / 1e6:.2f}M)")


def _check_flags(args: argparse.Namespace) -> None:
    """--tp, --pp and --microbatches belong to --parallel, which --hardware excludes."""
    if args.parallel and args.hardware:
        raise UsageError("--parallel and --hardware: give one of them")
    if not args.parallel:
        for flag in ("tp", "pp", "microbatches"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag} needs --parallel")
    if args.microbatches is not None and args.microbatches < 1:
        raise UsageError(f"--microbatches {args.microbatches}: must be >= 1")


def human(n: int) -> str:
    """Bytes as KiB, MiB or GiB (powers of 1024)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n} B"


def print_parallel(args: argparse.Namespace, config: ModelConfig, model) -> None:
    """The per-rank memory table of :func:`attnlab.placement.parallel_rows`, then the formulas."""
    from attnlab.build import count_parameters
    from attnlab.placement import parallel_rows

    rows, notes = parallel_rows(model, args.world, args.tp, args.pp, config=config)
    heads = f"{config.n_heads} heads (kv heads {config.kv_heads})"
    print(f"preset {args.preset}: {count_parameters(model):,} parameters, {heads}, "
          f"d_ff {config.d_ff}")
    print(f"training memory per rank, world {args.world} (fp32 weights and gradients, Adam's "
          "fp32 m and v; no activations)\n")
    header = ("layout", "ranks", "params/rank", "parameters", "gradients", "optimizer",
              "per rank", "vs 1 process")
    single = rows[0].total
    table = [header] + [(r.layout, str(r.world), f"{r.numel:,}", human(r.parameters),
                         human(r.gradients), human(r.optimizer), human(r.total),
                         f"{r.total / single:.3f}") for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True))))
    print("\nformulas (M: the parameters, N: the ranks that split them)")
    for line in _formulas(rows, config, args.microbatches):
        print(f"  {line}")
    for note in notes:
        print(f"  {note}")


def _formulas(rows: list[RankMemory], config: ModelConfig, microbatches: int | None) -> list[str]:
    """A few lines per kind of layout in ``rows``, with this model's numbers."""
    from attnlab.config import GATED
    from attnlab.placement import pipeline_layers, stage_sizes

    lines = ["bytes    4 (fp32 weight) + 4 (gradient) + 8 (Adam's m and v) = 16 per parameter"]
    if len(rows) > 1:
        lines += ["DDP      every rank holds all M: 16·M bytes",
                  "FSDP     parameters, gradients and Adam state sharded: M/N per rank "
                  "(each tensor ⌈rows/N⌉ rows)"]
    tp = next((r.tp for r in rows if r.tp > 1), 0)
    if tp:
        w1 = "w1, w3" if config.activation in GATED else "w1"
        lines += [f"TP {tp:<5} h/N = {config.n_heads}/{tp} = {config.n_heads // tp} "
                  f"head(s) (kv {config.kv_heads // tp}) per rank: q, k, v column-wise, output "
                  "row-wise",
                  f"         FFN d_ff/N = {config.d_ff}/{tp} = {config.d_ff / tp:g} units per "
                  f"rank: {w1} column-wise, w2 row-wise",
                  "         embeddings, head, norms and the row-wise layers' biases replicated"]
    pipe = next((r for r in rows if r.pp > 1), None)
    if pipe is not None:
        n, layers = pipe.pp, pipeline_layers(config)
        lines += [f"PP {n:<5} ⌈L/N⌉ = ⌈{layers}/{n}⌉ = {max(stage_sizes(layers, n))} "
                  f"layer(s) per stage; stage 0 also holds the embeddings,",
                  f"         stage {n - 1} the final norm and the head; the largest stage "
                  f"(stage {pipe.stage}) shown"]
        b = microbatches or 2 * n
        lines.append(f"         bubble efficiency B/(B+N−1) = {b}/{b + n - 1} = "
                     f"{b / (b + n - 1):.1%} for B = {b} micro-batches"
                     + ("" if microbatches else " (--microbatches B)"))
    mesh = next((r for r in rows if r.strategy == "fsdp" and r.tp > 1 and r.dp > 1), None)
    if mesh is not None:
        lines.append(f"FSDP×TP  a 2-D mesh (dp, tp), dp = world/tp = {mesh.world}/{mesh.tp} = "
                     f"{mesh.dp}: each rank's TP share, sharded M/dp")
    return lines


def add_commands(sub) -> None:
    info = sub.add_parser("info", help="print a preset's architecture and parameter counts",
                          description="Print a preset's architecture and parameter table; with "
                                      "--parallel, each rank's training memory under DDP, FSDP, "
                                      "tensor and pipeline parallelism (docs/scaling.md).")
    add_preset_args(info, "base", any_arch=True)
    info.add_argument("--hardware", action="store_true",
                      help="print the detected hardware and what --precision auto chooses")
    info.add_argument("--device", default="auto", help="with --hardware: the device to decide for")
    info.add_argument("--parallel", action="store_true",
                      help="print each rank's training memory (parameters, gradients, Adam) "
                           "under DDP, FSDP, tensor and pipeline parallelism, and the formulas")
    info.add_argument("--world", type=int, default=2, metavar="N",
                      help="with --parallel: the number of processes (ranks) in all")
    info.add_argument("--tp", type=int, metavar="N",
                      help="with --parallel: tensor-parallel ranks (must divide the heads and kv "
                           "heads), for the TP row and the FSDP x TP mesh over --world. Default: "
                           "TP over --world ranks, and the largest TP below --world that fits "
                           "for the mesh")
    info.add_argument("--pp", type=int, metavar="N",
                      help="with --parallel: pipeline stages (at most the layers). Default: "
                           "--world stages")
    info.add_argument("--microbatches", type=int, metavar="B",
                      help="with --parallel: micro-batches per step, for the pipeline's bubble "
                           "efficiency B/(B+N-1). Default: 2 x the stages, as train --pp")
    info.set_defaults(func=cmd_info)
