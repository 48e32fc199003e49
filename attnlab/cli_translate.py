"""Translation subcommands of the ``attnlab`` command line: ``tokenize train``,
``tokenize encode`` and ``evaluate``. Registered by :func:`attnlab.cli.build_parser`."""

from __future__ import annotations

import argparse
import time


def cmd_tokenize_train(args: argparse.Namespace) -> None:
    from attnlab.data import read_lines
    from attnlab.tokenizers import BPETokenizer

    texts = [line for path in args.files for line in read_lines(path)]
    if not texts:
        raise ValueError("the input files hold no text")
    tok = BPETokenizer.train(texts, args.vocab_size, args.min_frequency)
    tok.save_hf(args.out)
    print(f"byte-level BPE, {tok.vocab_size} tokens, learned from {len(texts):,} lines of "
          f"{len(args.files)} file(s): {args.out}")


def cmd_tokenize_encode(args: argparse.Namespace) -> None:
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.from_file(args.tokenizer)
    for text in args.text:
        ids = tok.encode(text)
        pieces = [tok.backend.id_to_token(i) for i in ids]
        print(" ".join(map(str, ids)))
        if args.pieces:
            print(" ".join(pieces))


def load_translation_model(path: str, device=None):
    """``(model, tokenizers)`` from a run or model folder, refusing other architectures."""
    from attnlab.training.checkpoint import load_model_dir

    model, config, toks = load_model_dir(path)
    if config.arch != "encoder-decoder" or "source" not in toks:
        raise ValueError(f"{path}: arch={config.arch!r} is not a translation model")
    return (model.to(device) if device is not None else model), toks


def cmd_evaluate(args: argparse.Namespace) -> None:
    from sacrebleu.metrics import BLEU, CHRF

    from attnlab import hardware
    from attnlab.cli_runtime import runtime
    from attnlab.data import read_lines
    from attnlab.training.recipes import translate

    device, precision = runtime(args)
    model, toks = load_translation_model(args.model, device)
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise ValueError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}")
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    start = time.perf_counter()
    with hardware.autocast(device, precision):
        hyps = translate(model, toks["source"], toks["target"], src, batch_size=args.batch,
                         beam_size=args.beam, alpha=args.alpha)
    seconds = time.perf_counter() - start
    n_tokens = sum(len(toks["target"].encode(h)) + 1 for h in hyps)  # + eos
    bleu_metric, chrf_metric = BLEU(), CHRF()
    bleu = bleu_metric.corpus_score(hyps, [ref])
    chrf = chrf_metric.corpus_score(hyps, [ref])
    print(f"{bleu}")
    print(f"signature: {bleu_metric.get_signature()}")
    print(f"chrF = {chrf.score:.2f}")
    print(f"decoding: {len(src)} sentences in {seconds:.1f} s: {len(src) / seconds:.1f} "
          f"sentences/s, {n_tokens / seconds:.0f} tokens/s "
          f"({'greedy' if args.beam == 1 else f'beam {args.beam}, alpha {args.alpha}'}; "
          f"{precision} on {device})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)


def add_commands(sub) -> None:
    tk = sub.add_parser("tokenize", help="learn or apply a byte-level BPE vocabulary",
                        description="Byte-level BPE through the tokenizers library.")
    tk_sub = tk.add_subparsers(dest="action", metavar="ACTION")
    tk_sub.required = True
    tr = tk_sub.add_parser("train", help="learn a shared vocabulary from text files",
                           description="Learn one BPE vocabulary from all FILES together (the "
                                       "paper shares it between source and target).")
    tr.add_argument("files", nargs="+", help="text files (plain or .gz), one sentence a line")
    tr.add_argument("--vocab-size", type=int, default=8000)
    tr.add_argument("--min-frequency", type=int, default=2)
    tr.add_argument("--out", default="tokenizer.json", help="where to write tokenizer.json")
    tr.set_defaults(func=cmd_tokenize_train)
    en = tk_sub.add_parser("encode", help="print the ids of texts",
                           description="Encode texts with a tokenizer.json.")
    en.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    en.add_argument("--pieces", action="store_true", help="also print the pieces")
    en.add_argument("text", nargs="+")
    en.set_defaults(func=cmd_tokenize_encode)

    ev = sub.add_parser("evaluate", help="corpus BLEU and chrF of a translation model",
                        description="Translate --src and score against --ref with sacreBLEU "
                                    "(detokenised, cased), printing the signature, chrF and "
                                    "decoding speed.")
    ev.add_argument("--model", required=True, help="a run or checkpoint folder")
    ev.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    ev.add_argument("--ref", required=True, help="reference translations, line-aligned")
    ev.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
    ev.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty α")
    ev.add_argument("--batch", type=int, default=64, help="sentences per batch")
    ev.add_argument("--limit", type=int, help="only the first N sentences")
    ev.add_argument("--out", help="write the translations here")
    from attnlab.cli_runtime import add_runtime_args

    add_runtime_args(ev)
    ev.set_defaults(func=cmd_evaluate)
