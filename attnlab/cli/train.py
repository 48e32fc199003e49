"""``attnlab train translate|lm|mlm|electra|classify|image`` and ``attnlab average``: each
builds a :class:`~attnlab.training.TrainConfig` from its flags and runs one recipe of
:mod:`attnlab.training.recipes`; the report after training is
:func:`attnlab.cli.training_options.report_run`."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from attnlab.cli.common import (
    UsageError,
    add_model_arg,
    add_out_arg,
    add_preset_args,
    add_runtime_args,
    preset_config,
    runtime,
)
from attnlab.cli.training_options import (
    add_finetuning_args,
    add_schedule_args,
    add_training_layout_args,
    finetuning,
    report_run,
    schedule_from_args,
    training_layout,
)


def _train_config(args: argparse.Namespace, schedule=None, **fields):
    """The fields every trainer shares, from the flags; ``fields`` add the family's own. The
    schedule is the flags' (:func:`schedule_from_args`) unless ``schedule`` is given."""
    from attnlab.training.schedule import schedule_to_dict
    from attnlab.training.trainer import TrainConfig

    text = getattr(args, "text", None)  # a missing input is named before the device line
    if isinstance(text, str) and text and not os.path.exists(text):
        raise UsageError(f"{text}: no such text file")
    schedule = (schedule_from_args(args) if schedule is None else
                schedule if isinstance(schedule, dict) else schedule_to_dict(schedule))
    device, precision = runtime(args, say=print)
    fields.setdefault("patience", args.patience)
    return TrainConfig(
        steps=args.steps, precision=precision, device=str(device), seed=args.seed,
        save_every=args.save_every, time_budget=args.time_budget, schedule=schedule,
        accumulate=args.accumulate, progress=not args.no_progress, **finetuning(args),
        **training_layout(args), **fields)


def _quoted(text: str, limit: int = 40) -> str:
    """``text`` as one shell word: its first line, at most ``limit`` characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return shlex.quote(line[:limit])


def _head(path: str, size: int = 4096) -> str:
    """The start of a text file (a suggestion of what to try reads no more)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(size)


NO_VALIDATION = ("no validation data: pass --valid-src/--valid-tgt or --holdout N to see "
                 "validation loss and BLEU")
BLEU_PAIRS = 200  # validation pairs translated for the BLEU after training


def cmd_train_translate(args: argparse.Namespace) -> None:
    from attnlab.data import load_corpus
    from attnlab.training import distributed
    from attnlab.training.recipes import TranslationRecipe, run

    if args.holdout is not None and args.holdout < 1:
        raise UsageError(f"--holdout must be >= 1, got {args.holdout}")
    model_config = preset_config(args, "encoder-decoder", "tiny, small, base or big")
    train_config = _train_config(
        args, schedule_from_args(args, model_config.d_model, args.lr_factor),
        max_tokens=args.max_tokens, compile=args.compile,
        keep_last=args.keep_last, label_smoothing=args.smoothing, eval_every=args.eval_every)
    corpus = load_corpus(args.task, args.src, args.tgt, n_train=args.n_train,
                         n_test=args.holdout, seed=args.seed, valid_src=args.valid_src,
                         valid_tgt=args.valid_tgt)
    train_config.plan().check(model_config)  # a bad split fails here, before any process waits
    main_rank = distributed.init_from_env(always=train_config.parallel_asked)[0] == 0
    if not corpus.test and main_rank:
        print(NO_VALIDATION)
    shared = None
    if args.tokenizer:
        from attnlab.tokenizers import BPETokenizer

        shared = BPETokenizer.from_file(args.tokenizer)
    done = run(TranslationRecipe(corpus, args.src_tokenizer, args.tgt_tokenizer, shared),
               args.out, model_config, train_config, resume=args.resume)
    lines = []
    if main_rank:
        model = done.model
        if args.average_last > 1:
            from attnlab.storage import load
            from attnlab.training.checkpoint import write_average

            folder, used = write_average(args.out, args.average_last)
            model = load(folder).model
            lines.append(f"averaged the last {len(used)} checkpoint{'s' * (len(used) > 1)} "
                         f"into {folder}")
        if corpus.test and args.evaluate:
            score = _exact_match_line if args.task == "numbers" else _bleu_line
            lines.append(score(model, done.tokenizers["source"], done.tokenizers["target"],
                               corpus.test))
    example = (corpus.test or corpus.train)[0][0]
    report_run(args.out, done.history, lines=lines, budget_note=done.budget_note,
               next_command=f"attnlab translate --model {args.out} {_quoted(example)}")


def _exact_match_line(model, src_tok, tgt_tok, pairs: list[tuple[str, str]]) -> str:
    """The numbers task's score, where each number has one right answer: the line
    ``held-out exact match: 99.4% of 500``."""
    from attnlab.generation import exact_match

    accuracy, _ = exact_match(model, src_tok, tgt_tok, pairs)
    return f"held-out exact match: {accuracy:.1%} of {len(pairs)}"


def _bleu_line(model, src_tok, tgt_tok, pairs: list[tuple[str, str]]) -> str:
    """Real text's score: sacreBLEU's corpus BLEU (13a, cased) of greedy translations of up
    to :data:`BLEU_PAIRS` validation pairs, evenly spaced through those whose source fits
    the model's ``max_len``. Returns the line ``validation BLEU 12.34 (...) on N of M ...``."""
    from attnlab.generation import translate
    from attnlab.metrics import corpus_bleu

    fits = [p for p in pairs if len(src_tok.encode(p[0], add_eos=True)) <= model.config.max_len]
    n = min(BLEU_PAIRS, len(fits))
    sample = [fits[i * len(fits) // n] for i in range(n)]
    too_long = (f"; {len(pairs) - len(fits)} with a source longer than "
                f"{model.config.max_len} tokens left out" if len(fits) < len(pairs) else "")
    if not sample:
        return f"validation BLEU: no validation source fits the model{too_long}"
    hyps = translate(model, src_tok, tgt_tok, [s for s, _ in sample])
    bleu, _ = corpus_bleu(hyps, [t for _, t in sample])
    return (f"validation BLEU {bleu.score:.2f} (sacreBLEU, greedy) on {n} of {len(pairs)} "
            f"validation pairs{too_long}")


def cmd_train_lm(args: argparse.Namespace) -> None:
    from attnlab.training.recipes import LMRecipe, run

    model_config = preset_config(args, "decoder", "gpt-mini or llama-mini")
    train_config = _train_config(
        args, compile=args.compile, keep_last=args.keep_last,
        label_smoothing=0.0, optimizer="adamw", weight_decay=args.weight_decay,
        betas=(0.9, 0.95), eps=1e-8, eval_every=args.eval_every)
    if args.int4 and not args.lora:
        raise UsageError("--int4 keeps the base frozen in 4 bits: train adapters over it with "
                         "--lora R")
    done = run(LMRecipe(args.text, args.block, args.batch, args.tokenizer, args.bpe_dir,
                        init=args.init, int4=args.int4),
               args.out, model_config, train_config, resume=args.resume)
    report_run(args.out, done.history, "validation loss", budget_note=done.budget_note,
               next_command=f"attnlab generate --model {args.out} --prompt "
                            f"{_quoted(_head(args.text), 12)} --max-new-tokens 200")


def _bert_config(args: argparse.Namespace, **fields):
    """BERT's fine-tuning and pretraining optimiser: AdamW (0.9, 0.999, 1e-6), linear warmup
    and decay (``--schedule``'s default)."""
    return _train_config(args, keep_last=2, label_smoothing=0.0, optimizer="adamw",
                         weight_decay=args.weight_decay, betas=(0.9, 0.999), eps=1e-6,
                         eval_every=args.eval_every, **fields)


def cmd_train_mlm(args: argparse.Namespace) -> None:
    from attnlab.training.recipes import MLMRecipe, run

    model_config = preset_config(args, "encoder", "bert-mini or bert-tiny")
    done = run(MLMRecipe(args.text, args.max_len, args.batch, args.tokenizer, args.vocab_size,
                         args.nsp), args.out, model_config, _bert_config(args),
               resume=args.resume)
    pair = " ".join(_quoted(line) for line in _head(args.text).splitlines()[:2])
    report_run(args.out, done.history, "validation masked-LM loss",
               budget_note=done.budget_note,
               next_command=f"attnlab embed --model {args.out} {pair}")


def cmd_train_electra(args: argparse.Namespace) -> None:
    from attnlab.training.electra import GENERATOR, ElectraRecipe
    from attnlab.training.recipes import run

    model_config = preset_config(args, "encoder", "electra-small or bert-mini")
    recipe = ElectraRecipe(args.text, args.max_len, args.batch, args.tokenizer,
                           args.vocab_size, generator_size=args.generator_size,
                           rtd_weight=args.rtd_weight)
    done = run(recipe, args.out, model_config, _bert_config(args), resume=args.resume)
    r, out = done.results, Path(args.out)
    report_run(args.out, done.history, "validation generator masked-LM loss",
               [f"discriminator on {r['rtd_tokens']:,.0f} validation tokens: accuracy "
                f"{r['rtd_accuracy']:.4f}; on the {r['rtd_replaced_share']:.1%} replaced "
                f"{r['rtd_replaced_accuracy']:.4f}, on the originals "
                f"{r['rtd_original_accuracy']:.4f}; ranking AUC {r['rtd_auc']:.4f}"],
               where=f"discriminator in {out / 'final'}, generator in {out / GENERATOR}")


def cmd_train_classify(args: argparse.Namespace) -> None:
    from attnlab.tasks.classify.recipe import ClassifyRecipe
    from attnlab.training.recipes import run

    recipe = ClassifyRecipe(args.data, args.text_field, args.label_field, args.init,
                            args.max_len, args.batch, args.id_field, pair_field=args.pair_field,
                            truncation=args.truncation, pool=args.pool, stride=args.stride)
    done = run(recipe, args.out, None, _bert_config(args),
               resume=args.resume)
    r = done.results
    report_run(args.out, done.history, "validation loss",
               [f"{split}: accuracy {r[f'{split}_accuracy']:.4f}, macro-F1 "
                f"{r[f'{split}_macro_f1']:.4f}" for split in ("val", "test")],
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=f"attnlab evaluate classify --model {args.out} --data {args.data} "
                            f"--text-field {args.text_field} --label-field {args.label_field}"
                            + (f" --id-field {args.id_field}" * (args.id_field != "id"))
                            + " --split test")


def cmd_train_ner(args: argparse.Namespace) -> None:
    from attnlab.tasks.ner.recipe import NERRecipe
    from attnlab.training.recipes import run

    recipe = NERRecipe(args.data, args.init, args.max_len, args.batch)
    done = run(recipe, args.out, None, _bert_config(args), resume=args.resume)
    r = done.results
    conll = next(p for name in ("test.txt", "dev.txt", "train.txt")
                 if (p := Path(args.data) / name).exists())
    report_run(args.out, done.history, "validation loss",
               [f"{split}: entity precision {r[f'{split}_precision']:.4f}, recall "
                f"{r[f'{split}_recall']:.4f}, F1 {r[f'{split}_f1']:.4f}"
                for split in ("dev", "test") if f"{split}_f1" in r],
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=f"attnlab evaluate ner --model {args.out} --data {conll}")


def cmd_train_qa(args: argparse.Namespace) -> None:
    from attnlab.tasks.qa.recipe import QARecipe, article_range
    from attnlab.training.recipes import run

    recipe = QARecipe(args.data, args.init, article_range(args.train_articles),
                      article_range(args.eval_articles), args.max_len, args.stride, args.batch,
                      args.max_answer_len)
    done = run(recipe, args.out, None, _bert_config(args), resume=args.resume)
    r = done.results
    report_run(args.out, done.history, "validation loss",
               [f"held-out articles: exact match {r['exact_match']:.2f}, F1 {r['f1']:.2f} "
                f"on {r['questions']:,} questions"],
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=f"attnlab evaluate qa --model {args.out} --data {args.data} "
                            f"--articles {args.eval_articles}")


def cmd_train_choice(args: argparse.Namespace) -> None:
    from attnlab.tasks.choice.recipe import ChoiceRecipe
    from attnlab.training.recipes import run

    recipe = ChoiceRecipe(args.data, args.init, args.valid, args.max_len, args.batch,
                          args.truncation)
    done = run(recipe, args.out, None, _bert_config(args), resume=args.resume)
    r = done.results
    split, key, data = (("validation", "val", args.valid) if args.valid
                        else ("training", "train", args.data))
    report_run(args.out, done.history, "validation loss",
               [f"{split} questions: accuracy {r[f'{key}_accuracy']:.4f} of "
                f"{r['questions']:,}"],
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=f"attnlab evaluate choice --model {args.out} --data {data}")


def cmd_train_image(args: argparse.Namespace) -> None:
    from attnlab.training.image import ImageRecipe
    from attnlab.training.recipes import run

    recipe = ImageRecipe(args.data, args.batch, args.crop)
    model_config = preset_config(args, "vision", "vit-tiny")
    train_config = _train_config(
        args, keep_last=2,
        label_smoothing=args.smoothing, optimizer="adamw", weight_decay=args.weight_decay,
        betas=(0.9, 0.999), eps=1e-8, eval_every=args.eval_every,
        stop_at_accuracy=args.stop_at_accuracy)
    done = run(recipe, args.out, model_config, train_config, resume=args.resume)
    r, last = done.results, done.history[-1]
    report_run(args.out, done.history, "validation loss",
               [f"trained {last['step']} steps in {last['time']:.1f} s"]
               + [f"{split}: accuracy {r[f'{split}_accuracy']:.4f}, macro-F1 "
                  f"{r[f'{split}_macro_f1']:.4f}" for split in ("val", "test")],
               where=f"model in {Path(args.out) / 'final'}", budget_note=done.budget_note,
               next_command=f"attnlab plot attention --image {args.data}:0 --model {args.out} "
                            f"--out {Path(args.out) / 'attention.png'}")


def cmd_average(args: argparse.Namespace) -> None:
    from attnlab.training.checkpoint import write_average

    folder, used = write_average(args.model, args.last, args.out)
    print(f"averaged {', '.join(p.name for p in used)} into {folder}")


# --- options -------------------------------------------------------------------------------
def _run_args(p: argparse.ArgumentParser, out: str, steps: int, save_every: int = 500,
              legacy: str | None = "--bf16", time_budget: float | None = None,
              patience: int = 0) -> None:
    """Options every trainer has: length, output folder, resuming, device, seed, early
    stopping, and the fine-tuning options (:func:`add_finetuning_args`)."""
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    p.add_argument("--time-budget", type=float, default=time_budget, metavar="SECONDS",
                   help="stop after this many seconds of training")
    add_out_arg(p, "the run folder", out)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--save-every", type=int, default=save_every,
                   help="steps between checkpoints")
    add_runtime_args(p, legacy=legacy)
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data order, dropout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--patience", type=int, default=patience,
                   help="early stopping: stop after N validation passes without a better "
                        "loss and keep the best model in OUT/best (0: never)")
    add_finetuning_args(p)
    add_training_layout_args(p)


def _bert_args(p: argparse.ArgumentParser, lr: float, warmup: int, eval_every: int) -> None:
    add_schedule_args(p, "linear", lr, warmup)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--max-len", type=int, default=128, help="tokens per sequence (at most)")
    p.add_argument("--eval-every", type=int, default=eval_every)


def add_commands(sub) -> None:
    from attnlab.cli.distill import add_subcommand

    train = sub.add_parser("train", help="train a model", description="Train a model.")
    kinds = train.add_subparsers(dest="what", metavar="KIND")
    kinds.required = True

    tt = kinds.add_parser(
        "translate", help="train an encoder-decoder translator",
        description="Train an encoder-decoder with the paper's recipe (Adam 0.9/0.98/1e-9, "
                    "warmup + inverse-sqrt learning rate, label smoothing 0.1).")
    tt.add_argument("--task", choices=["numbers"], help="built-in synthetic task")
    tt.add_argument("--src", help="source text file (plain or .gz), one sentence a line")
    tt.add_argument("--tgt", help="target text file, line-aligned with --src")
    tt.add_argument("--valid-src", metavar="FILE",
                    help="validation source file, line-aligned with --valid-tgt: validation "
                         "loss during training, BLEU after it")
    tt.add_argument("--valid-tgt", metavar="FILE", help="validation target file")
    tt.add_argument("--holdout", type=int, metavar="N",
                    help="hold the last N pairs of --src/--tgt out of training to validate "
                         "on (instead of --valid-src/--valid-tgt); with --task numbers, N "
                         "numbers never seen in training (500 unless given); on real "
                         "data nothing is held out unless given")
    tt.add_argument("--eval-every", type=int, default=500,
                    help="steps between validation passes, when there is validation data "
                         "(0: none)")
    tt.add_argument("--src-tokenizer", choices=["word", "char"], default="word")
    tt.add_argument("--tgt-tokenizer", choices=["word", "char"], default="char")
    tt.add_argument("--tokenizer", metavar="FILE",
                    help="one shared BPE tokenizer.json for both sides (attnlab tokenize train)")
    add_preset_args(tt, "tiny")
    tt.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch per side")
    add_schedule_args(tt, "noam", None, 4000,
                      lr_help="peak learning rate (default: noam's, --lr-factor x (d_model x "
                              "--warmup)^-0.5)")
    tt.add_argument("--lr-factor", type=float, default=1.0,
                    help="noam without --lr: the factor of its formula")
    tt.add_argument("--smoothing", type=float, default=0.1, help="label smoothing epsilon")
    tt.add_argument("--keep-last", type=int, default=5)
    tt.add_argument("--average-last", type=int, default=0, metavar="N",
                    help="after training, average the last N checkpoints into OUT/final")
    tt.add_argument("--compile", action="store_true", help="torch.compile the model")
    tt.add_argument("--n-train", type=int, default=200_000, help="numbers task: pairs")
    tt.add_argument("--no-evaluate", dest="evaluate", action="store_false",
                    help="skip the score after training: BLEU on up to "
                         f"{BLEU_PAIRS} validation pairs (exact match for --task numbers)")
    _run_args(tt, "runs/translate", 2000)
    tt.set_defaults(func=cmd_train_translate)

    lm = kinds.add_parser(
        "lm", help="train a decoder-only language model on a text file",
        description="Train a GPT/Llama-style model: AdamW (weight decay on matrices only), "
                    "linear warmup + cosine decay, gradient clipping; the last 10% of the "
                    "text is the validation split.")
    lm.add_argument("--text", required=True, help="a UTF-8 text file")
    lm.add_argument("--init", "--model", dest="init", metavar="MODEL",
                    help="fine-tune this language model (a run, an HF folder, a .gguf file or "
                         "smollm2) with its own tokenizer, instead of a new --preset model")
    lm.add_argument("--int4", action="store_true",
                    help="hold --init's weight matrices as frozen 4-bit codes and train "
                         "--lora adapters over them (QLoRA, on the CPU)")
    lm.add_argument("--tokenizer", choices=["char", "gpt2"], default="char")
    lm.add_argument("--bpe-dir", help="folder with GPT-2's encoder.json and vocab.bpe")
    add_preset_args(lm, "gpt-mini")
    lm.add_argument("--block", type=int, default=64, help="context length in tokens")
    lm.add_argument("--batch", type=int, default=12, help="sequences per step")
    add_schedule_args(lm, "cosine", 1e-3, 100, min_lr=1e-4)
    lm.add_argument("--weight-decay", type=float, default=0.1)
    lm.add_argument("--eval-every", type=int, default=500)
    lm.add_argument("--keep-last", type=int, default=3)
    lm.add_argument("--compile", action="store_true")
    _run_args(lm, "runs/lm", 2000)
    lm.set_defaults(func=cmd_train_lm)

    mlm = kinds.add_parser(
        "mlm", help="masked-LM pretraining of a BERT on a text file",
        description="BERT pretraining: 15% of tokens selected (80% [MASK], 10% random, "
                    "10% unchanged), loss on those only; AdamW, linear warmup and decay. Each "
                    "line is a sentence; the last 5% of lines validate.")
    mlm.add_argument("--text", required=True, help="a UTF-8 text file, one sentence a line")
    mlm.add_argument("--tokenizer", help="vocab.txt / tokenizer.json (default: learn WordPiece)")
    mlm.add_argument("--vocab-size", type=int, default=8000, help="when learning WordPiece")
    mlm.add_argument("--nsp", action="store_true", help="add next-sentence prediction")
    add_preset_args(mlm, "bert-mini")
    _bert_args(mlm, lr=5e-4, warmup=200, eval_every=500)
    _run_args(mlm, "runs/mlm", 2000)
    mlm.set_defaults(func=cmd_train_mlm)

    el = kinds.add_parser(
        "electra", help="ELECTRA pretraining: a discriminator detects a generator's tokens",
        description="ELECTRA pretraining: a small generator learns masked-LM (15% of tokens "
                    "selected, as train mlm) and the discriminator learns which tokens the "
                    "generator's samples replaced; loss MLM + λ·RTD; embeddings shared. The "
                    "data and optimiser are train mlm's. OUT/final is the discriminator, "
                    "OUT/generator the generator.")
    el.add_argument("--text", required=True, help="a UTF-8 text file, one sentence a line")
    el.add_argument("--tokenizer", help="vocab.txt / tokenizer.json (default: learn WordPiece)")
    el.add_argument("--vocab-size", type=int, default=8000, help="when learning WordPiece")
    el.add_argument("--generator-size", type=float, default=0.25, metavar="F",
                    help="the generator's hidden size, heads and feed-forward width as a "
                         "fraction of the discriminator's")
    el.add_argument("--rtd-weight", type=float, default=50.0, metavar="λ",
                    help="weight of the replaced-token detection loss")
    add_preset_args(el, "electra-small")
    _bert_args(el, lr=5e-4, warmup=200, eval_every=500)
    _run_args(el, "runs/electra", 2000)
    el.set_defaults(func=cmd_train_electra)

    cl = kinds.add_parser(
        "classify", help="fine-tune a BERT classifier on labelled JSON lines",
        description="Fine-tune a [CLS] classifier from a pretrained encoder: AdamW, linear "
                    "warmup and decay, early stopping on validation loss. The split is fixed "
                    "by hashing each example's id: 80% train, 10% validation, 10% test.")
    cl.add_argument("--data", required=True, help="a .jsonl or .jsonl.gz file")
    cl.add_argument("--text-field", required=True, help="field with the text (or F1,F2)")
    cl.add_argument("--label-field", required=True, help="field with the label")
    cl.add_argument("--id-field", default="id", help="field hashed for the split")
    cl.add_argument("--pair-field", metavar="FIELD",
                    help="the second text of a pair: [CLS] text [SEP] pair [SEP] (RoBERTa: "
                         "<s> text </s></s> pair </s>)")
    cl.add_argument("--truncation", choices=["longest_first", "only_second"],
                    default="longest_first", help="how a pair longer than --max-len is cut "
                                                  "(as transformers' tokenizers)")
    cl.add_argument("--pool", choices=["max", "mean"],
                    help="read texts longer than --max-len in overlapping windows and pool "
                         "their logits (default: cut them)")
    cl.add_argument("--stride", type=int, metavar="N",
                    help="tokens consecutive windows share (default: a quarter of a window)")
    cl.add_argument("--init", default="minilm",
                    help="encoder to start from: minilm, a HF BERT folder or an attnlab run")
    _bert_args(cl, lr=5e-5, warmup=60, eval_every=100)
    _run_args(cl, "runs/classify", 600, patience=3)
    cl.set_defaults(func=cmd_train_classify)

    ner = kinds.add_parser(
        "ner", help="fine-tune an encoder to tag named entities (CoNLL files)",
        description="Fine-tune a token classifier from a pretrained encoder on CoNLL files "
                    "(a word a line, its BIO tag in the last column, a blank line between "
                    "sentences), each word labelled at its first subword; AdamW, linear warmup "
                    "and decay, early stopping on the dev file's loss; entity-level P/R/F1 "
                    "(seqeval's) on dev and test after training.")
    ner.add_argument("--data", required=True,
                     help="a folder with train.txt, and dev.txt and test.txt if there are")
    ner.add_argument("--model", "--init", dest="init", default="minilm",
                     help="encoder to start from: minilm, a HF BERT folder or an attnlab run")
    _bert_args(ner, lr=5e-5, warmup=100, eval_every=200)
    _run_args(ner, "runs/ner", 1400, patience=3)
    ner.set_defaults(func=cmd_train_ner)

    qa = kinds.add_parser(
        "qa", help="fine-tune an encoder for extractive question answering (SQuAD format)",
        description="Fine-tune a span head (start and end logits) from a pretrained encoder on "
                    "SQuAD-format questions: contexts cut into windows of --max-len tokens "
                    "overlapping by --stride, the answer's first and last token as targets; "
                    "AdamW, linear warmup and decay, early stopping on the held-out loss; "
                    "SQuAD exact match and F1 on the held-out articles after training.")
    qa.add_argument("--data", required=True,
                    help="a SQuAD JSON file (.json or .json.gz), e.g. dev-v1.1.json.gz")
    qa.add_argument("--train-articles", default="0-37", metavar="FIRST-LAST",
                    help="articles (0-based, both ends included) to train on")
    qa.add_argument("--eval-articles", default="38-47", metavar="FIRST-LAST",
                    help="articles to validate and score on")
    qa.add_argument("--model", "--init", dest="init", default="minilm",
                    help="encoder to start from: minilm, a HF BERT folder or an attnlab run")
    qa.add_argument("--stride", type=int, default=128,
                    help="context tokens shared by consecutive windows")
    qa.add_argument("--max-answer-len", type=int, default=30, help="longest answer, in tokens")
    _bert_args(qa, lr=5e-5, warmup=100, eval_every=200)
    qa.set_defaults(max_len=384, batch=16)
    _run_args(qa, "runs/qa", 1000, patience=3)
    qa.set_defaults(func=cmd_train_qa)

    ch = kinds.add_parser(
        "choice", help="fine-tune an encoder to answer multiple-choice questions",
        description="Fine-tune a multiple-choice head from a pretrained encoder on the JSON "
                    "lines 'evaluate choice' reads (context, choices, answer): each choice "
                    "read with its context as a pair, one logit from the pooled [CLS], the "
                    "cross-entropy of the right one over the question's choices "
                    "(BertForMultipleChoice); AdamW, linear warmup and decay, early stopping "
                    "on --valid's loss.")
    ch.add_argument("--data", required=True, help="questions to train on (.jsonl)")
    ch.add_argument("--valid", metavar="FILE",
                    help="questions to validate on (default: none; the accuracy after "
                         "training is then on --data)")
    ch.add_argument("--model", "--init", dest="init", default="minilm",
                    help="encoder to start from: minilm, a HF BERT folder or an attnlab run")
    ch.add_argument("--truncation", choices=["longest_first", "only_second"],
                    default="longest_first", help="how a pair longer than --max-len is cut")
    _bert_args(ch, lr=5e-5, warmup=50, eval_every=100)
    ch.set_defaults(batch=16)
    _run_args(ch, "runs/choice", 500, patience=3)
    ch.set_defaults(func=cmd_train_choice)

    im = kinds.add_parser(
        "image", help="train a Vision Transformer image classifier",
        description="Train a ViT from scratch: AdamW (weight decay on matrices only), linear "
                    "warmup + cosine decay, label smoothing, early stopping on validation loss, "
                    "random-crop augmentation if asked (--crop). --data digits: scikit-learn's 8x8 "
                    "handwritten digits (1,797 images, offline) with a fixed split: 20% "
                    "test (only reported), and 10% of the rest validates.")
    im.add_argument("--data", required=True, help="the images: digits")
    add_preset_args(im, "vit-tiny")
    im.add_argument("--batch", type=int, default=64, help="images per step")
    add_schedule_args(im, "cosine", 1e-3, 100)
    im.add_argument("--weight-decay", type=float, default=0.05)
    im.add_argument("--smoothing", type=float, default=0.1, help="label smoothing epsilon")
    im.add_argument("--crop", type=int, default=0, metavar="PIXELS",
                    help="random crop: shift each training image by up to this many pixels "
                         "(0: none)")
    im.add_argument("--eval-every", type=int, default=100,
                    help="steps between validation passes")
    im.add_argument("--stop-at-accuracy", type=float, metavar="A",
                    help="stop at the first validation pass with accuracy >= A (0 < A <= 1); "
                         "that model is kept")
    _run_args(im, "runs/image", 3000, legacy=None, time_budget=120, patience=10)
    im.set_defaults(func=cmd_train_image)
    add_subcommand(kinds)

    avg = sub.add_parser("average", help="average the last checkpoints of a run",
                         description="Average the weights of a run's last N checkpoints (the "
                                     "paper averaged the last 5) into a model folder.")
    add_model_arg(avg, "a run folder (with checkpoints/)", adapter=False)
    avg.add_argument("--last", type=int, default=5)
    add_out_arg(avg, "the model folder to write (default: RUN/final)")
    avg.set_defaults(func=cmd_average)
