"""``attnlab translate`` (sentences through a trained translator) and ``attnlab evaluate``
(corpus BLEU and chrF with sacreBLEU, and decoding speed)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from attnlab.cli.common import (
    add_model_arg,
    add_out_arg,
    add_runtime_args,
    announce,
    runtime,
    texts,
    warn_unknown,
)


def _translator(args: argparse.Namespace, command: str):
    """The ``--model`` translation model on ``--device``, and the precision to run it in."""
    from attnlab.storage import load

    device, precision = runtime(args)
    loaded = load(args.model).expect("encoder-decoder", command)
    loaded.model.to(device)
    return loaded, device, precision


def cmd_translate(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.generation.translation import translate

    loaded, device, precision = _translator(args, "translate")
    sentences = texts(args, required=False)
    warn_unknown(loaded.tokenizers["source"], sentences, "input")
    announce(args, loaded.path, device, precision)
    with hardware.autocast(device, precision):
        hyps = translate(loaded.model, loaded.tokenizers["source"], loaded.tokenizers["target"],
                         sentences)
    for hyp in hyps:
        print(hyp)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from sacrebleu.metrics import BLEU, CHRF

    from attnlab import hardware
    from attnlab.cli.common import UsageError
    from attnlab.data import read_lines
    from attnlab.generation.translation import translate

    loaded, device, precision = _translator(args, "evaluate")
    src, ref = read_lines(args.src), read_lines(args.ref)  # the test corpus, as it is
    if len(src) != len(ref):
        raise UsageError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}")
    if args.out:  # a folder that cannot be made fails now, not after decoding
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    announce(args, loaded.path, device, precision)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    target = loaded.tokenizers["target"]
    start = time.perf_counter()
    with hardware.autocast(device, precision):
        hyps = translate(loaded.model, loaded.tokenizers["source"], target, src,
                         batch_size=args.batch, beam_size=args.beam, alpha=args.alpha)
    seconds = time.perf_counter() - start
    n_tokens = sum(len(target.encode(h)) + 1 for h in hyps)  # + eos
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
    tr = sub.add_parser("translate", help="translate with a trained model",
                        description="Translate the given sentences, or stdin line by line.")
    add_model_arg(tr, "a translation run or checkpoint folder")
    tr.add_argument("text", nargs="*", help="sentences (default: read stdin)")
    add_runtime_args(tr)
    tr.set_defaults(func=cmd_translate)

    ev = sub.add_parser("evaluate", help="corpus BLEU and chrF of a translation model",
                        description="Translate --src and score against --ref with sacreBLEU "
                                    "(detokenised, cased), printing the signature, chrF and "
                                    "decoding speed.")
    add_model_arg(ev, "a translation run or checkpoint folder")
    ev.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    ev.add_argument("--ref", required=True, help="reference translations, line-aligned")
    ev.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
    ev.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty α")
    ev.add_argument("--batch", type=int, default=64, help="sentences per batch")
    ev.add_argument("--limit", type=int, help="only the first N sentences")
    add_out_arg(ev, "write the translations to this file")
    add_runtime_args(ev)
    ev.set_defaults(func=cmd_evaluate)
