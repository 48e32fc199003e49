"""The ``attnlab`` command line.

Every subcommand has ``--help``. Bad input ends with one line on stderr naming the problem and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from attnlab.cli_runtime import UsageError, add_runtime_args, runtime


def _parse_override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string such as positional=rope


def preset_config(args: argparse.Namespace, arch: str, what: str, suggestion: str):
    """``--preset`` with its ``--set`` overrides, which must be of architecture ``arch``."""
    from attnlab import ModelConfig

    overrides = dict(_parse_override(s) for s in args.set)
    config = ModelConfig.from_preset(args.preset, **overrides)
    if config.arch != arch:
        raise UsageError(f"--preset {args.preset} is not {what} model (arch={config.arch!r}); "
                         f"try {suggestion}")
    return config


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab import ModelConfig, build_model, hardware, parameter_breakdown

    if args.hardware:
        print("\n".join(hardware.describe(args.device)))
        return
    overrides = dict(_parse_override(s) for s in args.set)
    config = ModelConfig.from_preset(args.preset, **overrides)
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        model = build_model(config)
    layers = {"encoder-decoder": f"{config.n_encoder_layers} encoder + "
                                 f"{config.n_decoder_layers} decoder",
              "decoder": f"{config.n_decoder_layers} (causal)",
              "encoder": f"{config.n_encoder_layers} (bidirectional)"}[config.arch]
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
    if config.arch == "encoder":
        rows += [("segment types", config.type_vocab_size), ("head", config.head)]
    print(f"preset {args.preset}")
    for key, value in rows:
        print(f"  {key:<20} {value}")
    print("\nparameters")
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<20} {count:>13,}  ({count / 1e6:.2f}M)")


def cmd_train_translate(args: argparse.Namespace) -> None:
    from attnlab import ModelConfig
    from attnlab.training.recipes import exact_match, load_corpus, train_translation
    from attnlab.training.schedule import NoamSchedule, schedule_to_dict
    from attnlab.training.trainer import TrainConfig, plot_loss_curve

    overrides = dict(_parse_override(s) for s in args.set)
    model_config = ModelConfig.from_preset(args.preset, **overrides)
    device, precision = runtime(args, say=print)
    corpus = load_corpus(args.task, args.src, args.tgt, n_train=args.n_train, seed=args.seed)
    schedule = NoamSchedule(model_config.d_model, args.warmup, args.lr_factor)
    train_config = TrainConfig(
        steps=args.steps, max_tokens=args.max_tokens, accumulate=args.accumulate,
        precision=precision, device=str(device), compile=args.compile, seed=args.seed,
        save_every=args.save_every, keep_last=args.keep_last, time_budget=args.time_budget,
        label_smoothing=args.smoothing,
        schedule=schedule_to_dict(schedule), progress=not args.no_progress,
    )
    shared = None
    if args.tokenizer:
        from attnlab.tokenizers import BPETokenizer

        shared = BPETokenizer.from_file(args.tokenizer)
    model, toks, history = train_translation(corpus, args.out, model_config, train_config,
                                             args.src_tokenizer, args.tgt_tokenizer,
                                             resume=args.resume, shared_tokenizer=shared)
    from attnlab.training import distributed

    if distributed.rank_and_world()[0] == 0:
        plot_loss_curve(Path(args.out) / "metrics.jsonl", Path(args.out) / "loss_curve.png")
        if args.average_last > 1:
            from attnlab.training.checkpoint import load_model_dir, write_average

            folder, used = write_average(args.out, args.average_last)
            model = load_model_dir(folder)[0]
            print(f"averaged the last {len(used)} checkpoints into {folder}")
        if corpus.test and args.evaluate:
            acc, _ = exact_match(model, toks["source"], toks["target"], corpus.test)
            print(f"held-out exact match: {acc:.1%} of {len(corpus.test)}")
        print(f"checkpoints in {Path(args.out) / 'checkpoints'}")
    distributed.shutdown()


def cmd_train_lm(args: argparse.Namespace) -> None:
    from attnlab.training.recipes import train_lm
    from attnlab.training.schedule import CosineSchedule, schedule_to_dict
    from attnlab.training.trainer import TrainConfig

    model_config = preset_config(args, "decoder", "a decoder-only", "gpt-mini or llama-mini")
    device, precision = runtime(args, say=print)
    schedule = CosineSchedule(args.lr, args.warmup, args.steps, args.min_lr)
    train_config = TrainConfig(
        steps=args.steps, accumulate=args.accumulate, precision=precision,
        device=str(device), compile=args.compile,
        seed=args.seed, save_every=args.save_every, keep_last=args.keep_last,
        label_smoothing=0.0, schedule=schedule_to_dict(schedule), optimizer="adamw",
        weight_decay=args.weight_decay, betas=(0.9, 0.95), eps=1e-8,
        eval_every=args.eval_every, progress=not args.no_progress, time_budget=args.time_budget,
    )
    _, _, history = train_lm(args.text, args.out, model_config, train_config, args.block,
                             args.batch, args.tokenizer, args.bpe_dir, resume=args.resume)
    report_run(args.out, history, "validation loss")


def report_run(out: str, history: list[dict], what: str) -> None:
    """After training: the loss curve PNG, the last validation loss, where checkpoints are."""
    from attnlab.training import distributed
    from attnlab.training.trainer import plot_loss_curve

    if distributed.rank_and_world()[0] == 0:
        plot_loss_curve(Path(out) / "metrics.jsonl", Path(out) / "loss_curve.png")
        val = [r["val_loss"] for r in history if "val_loss" in r]
        if val:
            print(f"{what} {val[-1]:.4f} after {history[-1]['step']} steps")
        print(f"checkpoints in {Path(out) / 'checkpoints'}")
    distributed.shutdown()


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.generation import generate
    from attnlab.generation.decoder_only import check_decoding
    from attnlab.interop.loading import load_for_generation

    if args.int4:  # PyTorch's 4-bit kernel is a CPU one; activations are bf16
        if args.precision not in (None, "auto", "bf16"):
            raise UsageError(f"--int4 computes in bf16; drop --precision {args.precision}")
        args.device = "cpu" if args.device == "auto" else args.device
    device, precision = runtime(args)
    model, tok = load_for_generation(args.model, int4=args.int4, device=device,
                                     precision=precision)
    ids = tok.encode(args.prompt)
    if not ids:  # nothing to condition on: start from the beginning-of-sequence token
        if getattr(tok, "bos_id", None) is None:
            raise UsageError("--prompt is empty and the tokenizer has no beginning-of-sequence "
                             "token to start from")
        ids = [tok.bos_id]
    if args.max_new_tokens >= model.config.max_len:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt "
                         f"in the model's context of {model.config.max_len}")
    if len(ids) + args.max_new_tokens > model.config.max_len:
        if not args.truncate:
            raise UsageError(f"prompt of {len(ids)} tokens + {args.max_new_tokens} new exceeds "
                             f"the model's context of {model.config.max_len} "
                             "(pass --truncate to keep the prompt's end)")
        ids = ids[-(model.config.max_len - args.max_new_tokens):]
    try:  # before anything is printed; name the flag, not the keyword argument
        check_decoding(torch.tensor([ids]), args.max_new_tokens, args.temperature, args.top_k,
                       args.top_p, args.repetition_penalty)
    except ValueError as e:
        name, rest = str(e).split(" ", 1)
        raise UsageError(f"--{name.replace('_', '-')} {rest}") from None
    stops = [s.encode().decode("unicode_escape") for s in args.stop]
    generator = torch.Generator(device=device).manual_seed(args.seed)
    printed = ""

    def stream(new_ids) -> bool:  # print what the new token adds; True stops generation
        nonlocal printed
        text = tok.decode(new_ids[0].tolist())
        hit = min((text.find(s) for s in stops if s in text), default=-1)
        if hit >= 0:
            text = text[:hit]
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed = text
        return hit >= 0

    sys.stdout.write(args.prompt)
    eos = None if args.ignore_eos else getattr(tok, "eos_id", None)
    generate(model, torch.tensor([ids], device=device), args.max_new_tokens,
             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
             repetition_penalty=args.repetition_penalty, eos_id=eos, generator=generator,
             on_token=stream)
    sys.stdout.write("\n")


def cmd_average(args: argparse.Namespace) -> None:
    from attnlab.training.checkpoint import write_average

    folder, used = write_average(args.model, args.last, args.out)
    print(f"averaged {', '.join(p.name for p in used)} into {folder}")


def cmd_translate(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.cli_translate import load_translation_model
    from attnlab.training.recipes import translate

    device, precision = runtime(args)
    model, toks = load_translation_model(args.model, device)
    sentences = args.text or [line.rstrip("\n") for line in sys.stdin]
    with hardware.autocast(device, precision):
        hyps = translate(model, toks["source"], toks["target"], sentences)
    for hyp in hyps:
        print(hyp)


def cmd_demo(args: argparse.Namespace) -> None:
    from attnlab.demo import run_demo

    device, precision = runtime(args, say=print)
    result = run_demo(args.out, steps=args.steps, time_budget=args.time_budget, n_test=args.n_test,
                      n_train=args.n_train, precision=precision, device=str(device))
    if args.min_accuracy is not None and result["accuracy"] < args.min_accuracy:
        raise UsageError(f"held-out exact match {result['accuracy']:.1%} is below "
                         f"--min-accuracy {args.min_accuracy:.1%}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab", description="Build, train, run and inspect Transformers."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="print a preset's architecture and parameter counts",
                          description="Print a preset's architecture and parameter table.")
    info.add_argument("--preset", default="base",
                      help="preset name (base, big, small, tiny, gpt2, gpt-mini, llama, ...)")
    info.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. --set positional=rope")
    info.add_argument("--hardware", action="store_true",
                      help="print the detected hardware and what --precision auto chooses")
    info.add_argument("--device", default="auto", help="with --hardware: the device to decide for")
    info.set_defaults(func=cmd_info)

    train = sub.add_parser("train", help="train a model", description="Train a model.")
    train_sub = train.add_subparsers(dest="what", metavar="KIND")
    train_sub.required = True
    tt = train_sub.add_parser(
        "translate", help="train an encoder-decoder translator",
        description="Train an encoder-decoder with the paper's recipe (Adam 0.9/0.98/1e-9, "
                    "warmup + inverse-sqrt learning rate, label smoothing 0.1).")
    tt.add_argument("--task", choices=["numbers"], help="built-in synthetic task")
    tt.add_argument("--src", help="source text file (plain or .gz), one sentence a line")
    tt.add_argument("--tgt", help="target text file, line-aligned with --src")
    tt.add_argument("--src-tokenizer", choices=["word", "char"], default="word")
    tt.add_argument("--tgt-tokenizer", choices=["word", "char"], default="char")
    tt.add_argument("--tokenizer", metavar="FILE",
                    help="one shared BPE tokenizer.json for both sides (attnlab tokenize train)")
    tt.add_argument("--preset", default="tiny", help="model preset (default: tiny)")
    tt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a model config field")
    tt.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch per side")
    tt.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    tt.add_argument("--steps", type=int, default=2000)
    tt.add_argument("--time-budget", type=float, help="stop after this many seconds")
    tt.add_argument("--warmup", type=int, default=4000)
    tt.add_argument("--lr-factor", type=float, default=1.0)
    tt.add_argument("--smoothing", type=float, default=0.1, help="label smoothing epsilon")
    tt.add_argument("--out", default="runs/translate", help="output folder")
    tt.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    tt.add_argument("--save-every", type=int, default=500)
    tt.add_argument("--keep-last", type=int, default=5)
    tt.add_argument("--average-last", type=int, default=0, metavar="N",
                    help="after training, average the last N checkpoints into OUT/final")
    add_runtime_args(tt, legacy="--bf16")
    tt.add_argument("--compile", action="store_true", help="torch.compile the model")
    tt.add_argument("--seed", type=int, default=0)
    tt.add_argument("--n-train", type=int, default=200_000, help="numbers task: pairs")
    tt.add_argument("--no-progress", action="store_true", help="no progress bar")
    tt.add_argument("--no-evaluate", dest="evaluate", action="store_false",
                    help="skip the held-out exact-match evaluation")
    tt.set_defaults(func=cmd_train_translate)

    avg = sub.add_parser("average", help="average the last checkpoints of a run",
                         description="Average the weights of a run's last N checkpoints (the "
                                     "paper averaged the last 5) into a model folder.")
    avg.add_argument("--model", required=True, help="run folder (with checkpoints/)")
    avg.add_argument("--last", type=int, default=5)
    avg.add_argument("--out", help="output folder (default: RUN/final)")
    avg.set_defaults(func=cmd_average)

    lm = train_sub.add_parser(
        "lm", help="train a decoder-only language model on a text file",
        description="Train a GPT/Llama-style model: AdamW (weight decay on matrices only), "
                    "linear warmup + cosine decay, gradient clipping; the last 10% of the "
                    "text is the validation split.")
    lm.add_argument("--text", required=True, help="a UTF-8 text file")
    lm.add_argument("--tokenizer", choices=["char", "gpt2"], default="char")
    lm.add_argument("--bpe-dir", help="folder with GPT-2's encoder.json and vocab.bpe")
    lm.add_argument("--preset", default="gpt-mini", help="gpt-mini, llama-mini, gpt2, ...")
    lm.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    lm.add_argument("--block", type=int, default=64, help="context length in tokens")
    lm.add_argument("--batch", type=int, default=12, help="sequences per step")
    lm.add_argument("--accumulate", type=int, default=1)
    lm.add_argument("--steps", type=int, default=2000)
    lm.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    lm.add_argument("--min-lr", type=float, default=1e-4)
    lm.add_argument("--warmup", type=int, default=100)
    lm.add_argument("--weight-decay", type=float, default=0.1)
    lm.add_argument("--eval-every", type=int, default=500)
    lm.add_argument("--time-budget", type=float)
    lm.add_argument("--out", default="runs/lm")
    lm.add_argument("--resume", action="store_true")
    lm.add_argument("--save-every", type=int, default=500)
    lm.add_argument("--keep-last", type=int, default=3)
    add_runtime_args(lm, legacy="--bf16")
    lm.add_argument("--compile", action="store_true")
    lm.add_argument("--seed", type=int, default=0)
    lm.add_argument("--no-progress", action="store_true")
    lm.set_defaults(func=cmd_train_lm)

    gen = sub.add_parser("generate", help="generate text, streamed token by token",
                         description="Generate from a trained run, a Hugging Face folder or a "
                                     "GGUF file.")
    gen.add_argument("--model", required=True, help="run/checkpoint folder, HF folder, .gguf")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=100)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--truncate", action="store_true", help="cut a too-long prompt's start")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--int4", action="store_true",
                     help="4-bit weights, bf16 activations (a GGUF keeps its own Q4_1 codes)")
    add_runtime_args(gen)
    gen.set_defaults(func=cmd_generate)

    tr = sub.add_parser("translate", help="translate with a trained model",
                        description="Translate the given sentences, or stdin line by line.")
    tr.add_argument("--model", required=True, help="checkpoint or run folder")
    tr.add_argument("text", nargs="*", help="sentences (default: read stdin)")
    add_runtime_args(tr)
    tr.set_defaults(func=cmd_translate)

    demo = sub.add_parser("demo", help="the main job: numbers EN->DE in a few minutes",
                          description="Train a small translator on English->German number "
                                      "words and report held-out exact match.")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--steps", type=int, default=1500,
                      help="training steps (the learning rate decays to zero at the last)")
    demo.add_argument("--time-budget", type=float,
                      help="stop training after this many seconds (the learning rate has not "
                           "decayed to zero then)")
    demo.add_argument("--n-train", type=int, default=200_000)
    demo.add_argument("--n-test", type=int, default=500)
    add_runtime_args(demo, legacy="--fp32")
    demo.add_argument("--min-accuracy", type=float, help="fail (exit 2) below this")
    demo.set_defaults(func=cmd_demo)

    from attnlab import cli_encoder, cli_explain, cli_translate

    cli_encoder.add_commands(sub, train_sub)
    cli_explain.add_commands(sub)
    cli_translate.add_commands(sub)
    return parser


def _one_line_warning(message, category, *rest, **kwargs) -> None:
    print(f"attnlab: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    from attnlab import hardware

    parser = build_parser()
    args = parser.parse_args(argv)
    hardware.use_threads()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            args.func(args)
    except (UsageError, ValueError, FileNotFoundError, TypeError, RuntimeError) as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
