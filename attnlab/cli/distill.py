"""``attnlab train distill``: a smaller student trained from a teacher run
(:mod:`attnlab.training.distill`); part of the ``train`` family, in its own module.

* a classifier teacher (``--data`` labelled JSON lines): soft targets + the hard labels, and
  optionally the last hidden states;
* a language-model teacher (``--text``): soft next-token targets, the same way;
* a translation teacher (``--src`` sources): sequence-level, the student trains on the
  teacher's beam-search translations.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from attnlab.cli.common import UsageError, add_out_arg, add_runtime_args, preset_config, runtime
from attnlab.cli.training_options import (
    add_finetuning_args,
    add_schedule_args,
    add_training_layout_args,
    finetuning,
    report_run,
    schedule_from_args,
    training_layout,
)

LR = 1e-4  # the peak of a classifier's or a language model's student without --lr


def _student(args: argparse.Namespace, arch: str):
    if (args.student_layers is None) == (args.student_preset is None):
        raise UsageError("give the student as --student-layers N (the teacher's config, fewer "
                         "layers, initialised from the teacher's) or --student-preset P")
    if args.student_preset is None:
        return None
    args.preset = args.student_preset
    return preset_config(args, arch, "a preset of the teacher's architecture")


def _train_config(args: argparse.Namespace, schedule: dict, **fields):
    from attnlab.training.trainer import TrainConfig

    device, precision = runtime(args, say=print)
    return TrainConfig(
        steps=args.steps, precision=precision, device=str(device), seed=args.seed,
        save_every=args.save_every, time_budget=args.time_budget, schedule=schedule,
        accumulate=args.accumulate, progress=not args.no_progress,
        eval_every=args.eval_every, **finetuning(args), **training_layout(args), **fields)


def cmd_train_distill(args: argparse.Namespace) -> None:
    from attnlab.storage import load

    teacher = load(args.teacher)
    arch = teacher.config.arch
    if arch == "encoder-decoder":
        return _sequence_level(args, teacher)
    from attnlab.tasks.classify.recipe import ClassifyRecipe
    from attnlab.training.distill import DistillRecipe
    from attnlab.training.recipes import LMRecipe, run

    preset = _student(args, arch)
    if arch == "encoder" and teacher.config.head == "classify":
        if not (args.data and args.text_field and args.label_field):
            raise UsageError("a classifier teacher is distilled on labelled data: give --data, "
                             "--text-field and --label-field")
        inner = ClassifyRecipe(args.data, args.text_field, args.label_field, args.teacher,
                               args.max_len, args.batch)
    elif arch == "decoder":
        if not args.text:
            raise UsageError("a language-model teacher is distilled on text: give --text")
        context = teacher.config.context
        if args.block and args.block > context:
            raise UsageError(f"--block {args.block}: the teacher sees at most {context} tokens")
        block = args.block or min(context, 128)
        inner = LMRecipe(args.text, block, args.batch, given=teacher.tokenizer)
    else:
        raise UsageError(f"{args.teacher}: a {arch} model with head {teacher.config.head!r}; "
                         "distillation takes a classifier, a language model or a translator")
    recipe = DistillRecipe(inner, teacher.model, args.student_layers, preset, args.temperature,
                           args.alpha, args.hidden_weight)
    args.schedule = args.schedule or "linear"
    args.lr = LR if args.lr is None else args.lr
    train_config = _train_config(
        args, schedule_from_args(args), optimizer="adamw",
        weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6, patience=args.patience, keep_last=2,
        label_smoothing=0.0)
    done = run(recipe, args.out, teacher.config, train_config, resume=args.resume)
    r = done.results
    lines = [f"{split}: accuracy {r[f'{split}_accuracy']:.4f}, macro-F1 "
             f"{r[f'{split}_macro_f1']:.4f}" for split in ("val", "test")
             if f"{split}_accuracy" in r]
    if args.student_layers:
        have = (teacher.config.n_decoder_layers if arch == "decoder"
                else teacher.config.n_encoder_layers)
        taken = [k * have // args.student_layers for k in range(args.student_layers)]
        lines.insert(0, f"student: {args.student_layers} of the teacher's {have} layers, "
                        f"initialised from its layers {taken}")
    try_next = (f"attnlab evaluate classify --model {args.out} --data {args.data} "
                f"--text-field {args.text_field} --label-field {args.label_field} --split test"
                if arch == "encoder" else
                f"attnlab generate --model {args.out} --prompt {_quoted_start(args.text)}")
    report_run(args.out, done.history, "validation loss", lines,
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=try_next)


def _quoted_start(path: str) -> str:
    """The first word of a text file, as one shell word: a prompt to try."""
    with open(path, encoding="utf-8", errors="replace") as f:
        words = f.read(200).split()
    return shlex.quote(words[0] if words else "The")


def _sequence_level(args: argparse.Namespace, teacher) -> None:
    """Kim and Rush: translate --src with the teacher, train the student on the outputs."""
    from attnlab.data import Corpus
    from attnlab.files import read_lines
    from attnlab.training.distill import sequence_level_corpus, student_config
    from attnlab.training.recipes import TranslationRecipe, run

    if not args.src:
        raise UsageError("a translation teacher is distilled at sequence level: give --src "
                         "(the training sources it translates)")
    preset = _student(args, "encoder-decoder")
    config = student_config(teacher.config, args.student_layers, preset)
    sources = read_lines(args.src)
    device, _ = runtime(args)
    src_tok, tgt_tok = teacher.tokenizers["source"], teacher.tokenizers["target"]
    pairs = sequence_level_corpus(teacher.model.to(device), src_tok, tgt_tok, sources,
                                  beam=args.beam)
    print(f"the teacher translated {len(sources):,} sources (beam {args.beam}); "
          f"{len(pairs):,} non-empty translations are the student's targets")
    valid = []
    if args.valid_src and args.valid_tgt:
        valid = list(zip(read_lines(args.valid_src), read_lines(args.valid_tgt), strict=False))
    shared = src_tok if src_tok.to_dict() == tgt_tok.to_dict() else None
    corpus = Corpus(pairs, valid, "--valid-src/--valid-tgt" if valid else "no validation data")
    args.schedule = args.schedule or "noam"
    train_config = _train_config(args, schedule_from_args(args, config.d_model, args.lr_factor),
                                 max_tokens=args.max_tokens, label_smoothing=0.1, keep_last=2)
    done = run(TranslationRecipe(corpus, type(src_tok).__name__.removesuffix("Tokenizer")
                                 .lower(), type(tgt_tok).__name__.removesuffix("Tokenizer")
                                 .lower(), shared),
               args.out, config, train_config, resume=args.resume)
    report_run(args.out, done.history, budget_note=done.budget_note,
               next_command=f"attnlab translate --model {args.out} "
                            f"{shlex.quote(pairs[0][0][:40])}")


def add_subcommand(kinds) -> None:
    d = kinds.add_parser(
        "distill", help="train a smaller student from a teacher run",
        description="Knowledge distillation. A classifier or language-model teacher: the "
                    "student learns alpha x the hard labels' cross-entropy + (1 - alpha) x "
                    "T^2 x KL(teacher || student) at temperature T (Hinton et al., 2015), plus "
                    "--hidden-weight x (1 - cos) of the last hidden states (DistilBERT). A "
                    "translation teacher: sequence level (Kim and Rush, 2016), the student "
                    "trains on the teacher's beam-search translations of --src.")
    d.add_argument("--teacher", required=True, help="the teacher: a run or model folder")
    d.add_argument("--student-layers", type=int, metavar="N",
                   help="the teacher's config with N layers, initialised from its layers 0, "
                        "L/N, 2L/N, ... (DistilBERT); encoder-decoders start from scratch")
    d.add_argument("--student-preset", metavar="P",
                   help="a preset (with --set overrides), trained from scratch")
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of --student-preset")
    d.add_argument("--temperature", type=float, default=2.0, help="T of the soft targets")
    d.add_argument("--alpha", type=float, default=0.5, help="weight of the hard labels' loss")
    d.add_argument("--hidden-weight", type=float, default=0.0,
                   help="weight of the hidden-state cosine loss (same width only)")
    d.add_argument("--data", help="classifier teacher: labelled .jsonl")
    d.add_argument("--text-field", help="classifier teacher: field with the text")
    d.add_argument("--label-field", help="classifier teacher: field with the label")
    d.add_argument("--text", help="language-model teacher: a text file")
    d.add_argument("--block", type=int,
                   help="language model: tokens per window (default: 128, or the teacher's "
                        "context if shorter)")
    d.add_argument("--src", help="translation teacher: the sources it translates")
    d.add_argument("--valid-src", help="translation: validation sources")
    d.add_argument("--valid-tgt", help="translation: validation references")
    d.add_argument("--beam", type=int, default=4, help="translation: the teacher's beam")
    d.add_argument("--max-tokens", type=int, default=4096, help="translation: tokens a batch")
    d.add_argument("--lr-factor", type=float, default=1.0,
                   help="translation: the factor of the warmup + inverse-square-root schedule "
                        "(--warmup steps) without --lr")
    d.add_argument("--max-len", type=int, default=128, help="classifier: tokens per example")
    d.add_argument("--batch", type=int, default=32, help="examples or windows per step")
    add_schedule_args(d, None, None, 60,
                      lr_help=f"peak learning rate (default {LR:g}; a translation teacher: "
                              "noam's peak)")
    d.add_argument("--eval-every", type=int, default=100)
    d.add_argument("--patience", type=int, default=3,
                   help="stop after N validation passes without improvement (0: never)")
    d.add_argument("--steps", type=int, default=600, help="optimizer steps")
    d.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop after this many seconds of training")
    add_out_arg(d, "the run folder", "runs/distill")
    d.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    d.add_argument("--save-every", type=int, default=500, help="steps between checkpoints")
    add_runtime_args(d)
    add_finetuning_args(d)
    add_training_layout_args(d)
    d.add_argument("--seed", type=int, default=0, help="seed of weights, data order, dropout")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(func=cmd_train_distill)
