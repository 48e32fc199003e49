"""Encoder (BERT) subcommands of the ``attnlab`` command line: ``train mlm``,
``train classify``, ``classify`` and ``embed``. Registered by :func:`attnlab.cli.build_parser`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _train_config(args: argparse.Namespace, steps: int):
    from attnlab.cli_runtime import runtime
    from attnlab.training.schedule import LinearSchedule, schedule_to_dict
    from attnlab.training.trainer import TrainConfig

    device, precision = runtime(args, say=print)
    return TrainConfig(
        steps=steps, accumulate=1, precision=precision, device=str(device), seed=args.seed,
        save_every=args.save_every, keep_last=2, label_smoothing=0.0, optimizer="adamw",
        weight_decay=args.weight_decay,
        betas=(0.9, 0.999), eps=1e-6, eval_every=args.eval_every,
        schedule=schedule_to_dict(LinearSchedule(args.lr, args.warmup, steps)),
        progress=not args.no_progress, time_budget=args.time_budget,
        patience=getattr(args, "patience", 0),
    )


def cmd_train_mlm(args: argparse.Namespace) -> None:
    from attnlab.cli import preset_config, report_run
    from attnlab.training.bert_recipes import train_mlm

    model_config = preset_config(args, "encoder", "an encoder", "bert-mini or bert-tiny")
    _, _, history = train_mlm(args.text, args.out, model_config, _train_config(args, args.steps),
                              args.max_len, args.batch, args.tokenizer, args.vocab_size,
                              args.nsp, resume=args.resume)
    report_run(args.out, history, "validation masked-LM loss")


def cmd_train_classify(args: argparse.Namespace) -> None:
    from attnlab.training import distributed
    from attnlab.training.bert_recipes import train_classify

    results = train_classify(args.data, args.text_field, args.label_field, args.init, args.out,
                             _train_config(args, args.steps), args.max_len, args.batch,
                             args.id_field, resume=args.resume)
    if distributed.rank_and_world()[0] == 0:
        for split in ("val", "test"):
            print(f"{split}: accuracy {results[f'{split}_accuracy']:.4f}, "
                  f"macro-F1 {results[f'{split}_macro_f1']:.4f}")
        print(f"model in {Path(args.out) / 'final'}")
    distributed.shutdown()


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        from attnlab.cli import UsageError

        raise UsageError("no input text (give sentences as arguments or on stdin)")
    return texts


def _encoder(args: argparse.Namespace):
    """The ``--model`` encoder on ``--device``, and the precision to run it in."""
    from attnlab.cli_runtime import runtime
    from attnlab.encoding import load_encoder

    device, precision = runtime(args)
    enc = load_encoder(args.model)
    enc.model.to(device)
    return enc, device, precision


def cmd_classify(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.encoding import classify_texts

    enc, device, precision = _encoder(args)
    labels = enc.labels or [str(i) for i in range(enc.model.config.num_labels)]
    texts = _texts(args)
    with hardware.autocast(device, precision):
        probs = classify_texts(enc, texts)
    for text, p in zip(texts, probs, strict=True):
        best = int(p.argmax())
        print(f"{labels[best]}\t{float(p[best]):.4f}\t{text[:80]}")


def cmd_embed(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.encoding import embed_sentences

    enc, device, precision = _encoder(args)
    texts = _texts(args)
    with hardware.autocast(device, precision):
        vectors = embed_sentences(enc, texts, normalize=not args.no_normalize).float()
    if args.json:
        for text, v in zip(texts, vectors, strict=True):
            print(json.dumps({"text": text, "embedding": [round(x, 6) for x in v.tolist()]}))
        return
    for i, (text, v) in enumerate(zip(texts, vectors, strict=True)):
        head = ", ".join(f"{x:+.4f}" for x in v[:6].tolist())
        print(f"[{i}] {text}\n    ({v.shape[0]} dims) [{head}, ...]")
    if len(texts) > 1:
        unit = vectors / vectors.norm(dim=-1, keepdim=True)
        cos = unit @ unit.T
        print("cosine similarity:")
        print("      " + "".join(f"{f'[{j}]':>8}" for j in range(len(texts))))
        for i in range(len(texts)):
            print(f"  [{i}] " + "".join(f"{float(cos[i, j]):8.4f}" for j in range(len(texts))))


def _common_training(p: argparse.ArgumentParser, lr: float, warmup: int) -> None:
    from attnlab.cli_runtime import add_runtime_args

    p.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=warmup, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--max-len", type=int, default=128, help="tokens per sequence (at most)")
    p.add_argument("--time-budget", type=float, help="stop after this many seconds")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--save-every", type=int, default=500)
    add_runtime_args(p, legacy="--bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")


def add_commands(sub, train_sub) -> None:
    from attnlab.cli_runtime import add_runtime_args

    mlm = train_sub.add_parser(
        "mlm", help="masked-LM pretraining of a BERT on a text file",
        description="BERT pretraining: 15% of tokens selected (80% [MASK], 10% random, "
                    "10% unchanged), loss on those only; AdamW, linear warmup and decay. Each "
                    "line is a sentence; the last 5% of lines validate.")
    mlm.add_argument("--text", required=True, help="a UTF-8 text file, one sentence a line")
    mlm.add_argument("--tokenizer", help="vocab.txt / tokenizer.json (default: learn WordPiece)")
    mlm.add_argument("--vocab-size", type=int, default=8000, help="when learning WordPiece")
    mlm.add_argument("--nsp", action="store_true", help="add next-sentence prediction")
    mlm.add_argument("--preset", default="bert-mini", help="bert-mini, bert-tiny, bert-base, ...")
    mlm.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    mlm.add_argument("--steps", type=int, default=2000)
    mlm.add_argument("--eval-every", type=int, default=500)
    mlm.add_argument("--out", default="runs/mlm")
    _common_training(mlm, lr=5e-4, warmup=200)
    mlm.set_defaults(func=cmd_train_mlm)

    cl = train_sub.add_parser(
        "classify", help="fine-tune a BERT classifier on labelled JSON lines",
        description="Fine-tune a [CLS] classifier from a pretrained encoder: AdamW, linear "
                    "warmup and decay, early stopping on validation loss. The split is fixed "
                    "by hashing each example's id: 80% train, 10% validation, 10% test.")
    cl.add_argument("--data", required=True, help="a .jsonl or .jsonl.gz file")
    cl.add_argument("--text-field", required=True, help="field with the text (or F1,F2)")
    cl.add_argument("--label-field", required=True, help="field with the label")
    cl.add_argument("--id-field", default="id", help="field hashed for the split")
    cl.add_argument("--init", default="minilm",
                    help="encoder to start from: minilm, a HF BERT folder or an attnlab run")
    cl.add_argument("--steps", type=int, default=600)
    cl.add_argument("--eval-every", type=int, default=100)
    cl.add_argument("--patience", type=int, default=3,
                    help="stop after N validation passes without improvement (0: never)")
    cl.add_argument("--out", default="runs/classify")
    _common_training(cl, lr=5e-5, warmup=60)
    cl.set_defaults(func=cmd_train_classify)

    c = sub.add_parser("classify", help="label texts with a fine-tuned classifier",
                       description="Print the predicted label, its probability and the text.")
    c.add_argument("--model", required=True, help="run folder from 'attnlab train classify'")
    c.add_argument("text", nargs="*", help="texts (default: stdin, one per line)")
    add_runtime_args(c)
    c.set_defaults(func=cmd_classify)

    e = sub.add_parser("embed", help="sentence embeddings and their cosine similarities",
                       description="Mean-pool the encoder's output over real tokens, then "
                                   "L2-normalise (how all-MiniLM-L6-v2 is meant to be used).")
    e.add_argument("--model", default="minilm", help="minilm, a HF BERT folder or an attnlab run")
    e.add_argument("--json", action="store_true", help="print full vectors as JSON lines")
    e.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    e.add_argument("text", nargs="*", help="sentences (default: stdin, one per line)")
    add_runtime_args(e)
    e.set_defaults(func=cmd_embed)
