"""The options every trainer shares: memory and parallelism, fine-tuning (adapters, layer-wise
learning rates, gradual unfreezing), the learning-rate schedule and its warmup, and the one
report printed after training. ``train``, ``train distill`` and ``plot schedule`` read them;
the inference commands never import this module."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import UsageError


def add_training_layout_args(p: argparse.ArgumentParser) -> None:
    """Every trainer's options for memory and for training beyond one device
    (:mod:`attnlab.training.parallel`; docs/scaling.md)."""
    from attnlab.training.parallel import MODES, SCHEDULES, STRATEGIES

    g = p.add_argument_group("memory and parallelism (see docs/scaling.md)")
    g.add_argument("--activation-checkpointing", choices=MODES, default="none",
                   help="recompute activations in backward: each block, or segments of about "
                   "sqrt(N) blocks")
    g.add_argument("--parallel", choices=STRATEGIES,
                   help="under torchrun: replicate the model (ddp, the default with several "
                   "processes) or shard it (fsdp)")
    g.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: each process computes heads/N heads")
    g.add_argument("--pp", type=int, default=1, metavar="N",
                   help="pipeline parallelism: N stages of about layers/N layers")
    g.add_argument("--microbatches", type=int, metavar="B",
                   help="pipeline micro-batches per batch (default 2 x --pp)")
    g.add_argument("--pp-schedule", choices=tuple(SCHEDULES),
                   help="pipeline schedule (default gpipe)")


def training_layout(args: argparse.Namespace) -> dict[str, object]:
    """The :class:`~attnlab.training.TrainConfig` fields of :func:`add_training_layout_args`."""
    return dict(parallel=args.parallel, tp=args.tp, pp=args.pp,
                microbatches=args.microbatches, pp_schedule=args.pp_schedule,
                activation_checkpointing=args.activation_checkpointing)


def add_finetuning_args(p: argparse.ArgumentParser) -> None:
    """Adapters, discriminative learning rates, progressive unfreezing."""
    g = p.add_argument_group("fine-tuning (adapters and schedules)")
    method = g.add_mutually_exclusive_group()
    method.add_argument("--lora", type=int, metavar="R",
                        help="train LoRA adapters of rank R over the frozen model (the task "
                             "head trains in full); written in peft's format to OUT/adapter")
    method.add_argument("--bottleneck", type=int, metavar="M",
                        help="train bottleneck (Houlsby) adapters of size M after attention "
                             "and the feed-forward instead")
    g.add_argument("--lora-alpha", type=float, metavar="A",
                   help="LoRA's scale numerator: the update is (A/R)·BA (default 2R)")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on LoRA's input")
    g.add_argument("--lora-targets", metavar="NAMES",
                   help="comma-separated layer names, peft's or attnlab's: q,v (default for "
                        "LoRA), query,value, c_attn, q_proj,k_proj,v_proj,o_proj, w1,w2, ...")
    g.add_argument("--layer-decay", type=float, default=1.0, metavar="XI",
                   help="discriminative learning rates: each layer's rate is XI times the "
                        "one above (the course: 0.5); embeddings lowest, heads at the full "
                        "rate")
    g.add_argument("--unfreeze-every", type=int, default=0, metavar="N",
                   help="progressive unfreezing: train the top (head) first and one more "
                        "layer below it every N steps (0: all at once)")


SCHEDULE_NAMES = ("noam", "cosine", "linear", "polynomial", "constant")


def add_schedule_args(p: argparse.ArgumentParser, schedule: str, lr: float | None, warmup: int,
                      min_lr: float = 0.0, lr_help: str = "peak learning rate") -> None:
    """The options every trainer has for its learning rate and its batch, with the command's
    own defaults: the schedule (attnlab.training.schedule), its peak, its warmup, the decay's
    options, and gradient accumulation. :func:`schedule_from_args` reads them."""
    g = p.add_argument_group("learning rate and batch")
    g.add_argument("--schedule", choices=SCHEDULE_NAMES, default=schedule,
                   help="noam: the paper's warmup + inverse square root; cosine, linear, "
                        "polynomial: warmup then decay to the last step; constant: warmup then "
                        "the peak")
    g.add_argument("--lr", type=float, default=lr, help=lr_help)
    g.add_argument("--warmup", type=int, default=warmup, metavar="STEPS",
                   help="linear warmup steps")
    g.add_argument("--warmup-ratio", type=float, metavar="R",
                   help="warmup over this share of the steps instead (the course: 0.06-0.1)")
    g.add_argument("--min-lr", type=float, metavar="LR",
                   help=f"cosine: the rate it decays to (default {min_lr:g})")
    g.add_argument("--lr-end", type=float, metavar="LR",
                   help="polynomial: the rate at the last step (default 1e-7)")
    g.add_argument("--power", type=float, help="polynomial: the decay's power (default 1)")
    g.add_argument("--accumulate", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step: one step on the gradient of N "
                        "batches")
    p.set_defaults(default_min_lr=min_lr)


def adapter_request(args: argparse.Namespace) -> dict | None:
    """``--lora R`` / ``--bottleneck M`` and their options, as TrainConfig.adapter."""
    targets = [t for t in (args.lora_targets or "").split(",") if t] or None
    base = str(getattr(args, "init", "") or "")
    if args.lora is not None:  # (0 too: refused, not taken for "no LoRA")
        if args.lora < 1:
            raise UsageError(f"--lora must be a rank >= 1, got {args.lora}")
        return dict(method="lora", r=args.lora, alpha=args.lora_alpha,
                    dropout=args.lora_dropout, targets=targets, base=base)
    if args.bottleneck is not None:
        if args.bottleneck < 1:
            raise UsageError(f"--bottleneck must be a size >= 1, got {args.bottleneck}")
        return dict(method="bottleneck", size=args.bottleneck, targets=targets, base=base)
    if args.lora_targets or args.lora_alpha is not None:
        raise UsageError("--lora-targets and --lora-alpha need --lora R (or --bottleneck M)")
    return None


def warmup_steps(args: argparse.Namespace) -> int:
    """Warmup steps: ``--warmup-ratio`` of ``--steps`` when given (the course: 6-10%), else
    ``--warmup``."""
    if getattr(args, "warmup_ratio", None) is None:
        if args.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
        return args.warmup
    if not 0 <= args.warmup_ratio < 1:
        raise UsageError(f"--warmup-ratio must be in [0, 1), got {args.warmup_ratio}")
    return round(args.warmup_ratio * args.steps)


def schedule_from_args(args: argparse.Namespace, d_model: int = 512,
                       factor: float = 1.0) -> dict:
    """The schedule of :func:`add_schedule_args`'s flags, as TrainConfig.schedule. Noam takes
    ``--lr`` as its peak (the rate at step --warmup), or without it ``factor``; another schedule
    without ``--lr`` peaks where Noam would. A decay's option given to another schedule is
    refused: it would do nothing."""
    from attnlab.training.schedule import NoamSchedule, make_schedule, schedule_to_dict

    kind = args.schedule
    for flag, value, used_by in (("--min-lr", args.min_lr, "cosine"),
                                 ("--lr-end", args.lr_end, "polynomial"),
                                 ("--power", args.power, "polynomial")):
        if value is not None and kind != used_by:
            raise UsageError(f"{flag} is an option of --schedule {used_by}, not {kind}")
    warmup = warmup_steps(args)
    peak = args.lr
    if peak is None and kind != "noam":
        peak = NoamSchedule(d_model, max(warmup, 1), factor).peak_lr
    optional = {name: value for name, value in (("lr_end", args.lr_end), ("power", args.power))
                if value is not None}
    return schedule_to_dict(make_schedule(
        kind, peak, warmup, args.steps, d_model=d_model, factor=factor,
        min_lr=getattr(args, "default_min_lr", 0.0) if args.min_lr is None else args.min_lr,
        **optional))


def finetuning(args: argparse.Namespace) -> dict[str, object]:
    """The :class:`~attnlab.training.TrainConfig` fields of :func:`add_finetuning_args`."""
    return dict(adapter=adapter_request(args), layer_decay=args.layer_decay,
                unfreeze_every=args.unfreeze_every)


# --- the report after training ---------------------------------------------------------------
def report_run(out: str | Path, history: list[dict], what: str = "validation loss",
               lines: list[str] | tuple[str, ...] = (), where: str | None = None,
               budget_note: str | None = None, next_command: str | None = None) -> None:
    """On rank 0: the loss curve PNG, ``lines``, the last validation loss, where the
    checkpoints (or ``where``) are, what the time budget did (``budget_note``) and the
    command to try next; then the process group, if any, is shut down."""
    from attnlab.training import distributed

    if distributed.rank_and_world()[0] == 0:
        from attnlab.viz import plot_loss_curve

        out = Path(out)
        plot_loss_curve(out / "metrics.jsonl", out / "loss_curve.png")
        for line in lines:
            print(line)
        val = [r["val_loss"] for r in history if "val_loss" in r]
        if val:
            print(f"{what} {val[-1]:.4f} after {history[-1]['step']} steps")
        print(where or f"checkpoints in {out / 'checkpoints'}")
        if budget_note:
            print(budget_note)
        if next_command:
            print(f"try: {next_command}")
    distributed.shutdown()
