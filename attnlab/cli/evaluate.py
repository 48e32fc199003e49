"""``attnlab evaluate``: one command group for every way attnlab scores something.

* ``evaluate translate``: a translation model on a test set: it translates ``--src`` and scores
  against ``--ref`` (sacreBLEU's BLEU and chrF, ROUGE), with the decoding speed;
* ``evaluate text``: any hypothesis file against a reference file, one example a line.

The flat form of an earlier release, ``attnlab evaluate --model M --src S --ref R``, still runs
``evaluate translate``, after a one-line deprecation note (``cli.LEGACY``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from attnlab.cli.common import (
    UsageError,
    add_model_arg,
    add_out_arg,
    add_runtime_args,
    announce,
    load_for,
)


def _examples(path: str) -> list[str]:
    """One example a line (plain or .gz); the two characters ``\\n`` inside a line separate
    the example's sentences (what ROUGE-Lsum splits on)."""
    from attnlab.data import read_lines

    return [line.replace("\\n", "\n") for line in read_lines(path)]


def _aligned(hyp_path: str, ref_path: str, hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise UsageError(f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}")


def cmd_evaluate_translate(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.generation.translation import translate
    from attnlab.metrics import text_scores

    loaded, device, precision = load_for(args, "encoder-decoder")
    src, ref = _examples(args.src), _examples(args.ref)  # the test corpus, as it is
    _aligned(args.src, args.ref, src, ref)
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
    for line in text_scores(hyps, ref, args.lang):
        print(line)
    print(f"decoding: {len(src)} sentences in {seconds:.1f} s: {len(src) / seconds:.1f} "
          f"sentences/s, {n_tokens / seconds:.0f} tokens/s "
          f"({'greedy' if args.beam == 1 else f'beam {args.beam}, alpha {args.alpha}'}; "
          f"{precision} on {device})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(h.replace("\n", "\\n") + "\n" for h in hyps)


def cmd_evaluate_text(args: argparse.Namespace) -> None:
    from attnlab.metrics import text_scores

    hyps, refs = _examples(args.hyp), _examples(args.ref)
    _aligned(args.hyp, args.ref, hyps, refs)
    if not hyps:
        raise UsageError(f"{args.hyp} holds no examples")
    for line in text_scores(hyps, refs, args.lang):
        print(line)


def _add_lang(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", default="en",
                   help="language of the references, for ROUGE's words: en (rouge-score's "
                        "tokenizer, Porter stemming) or any other code (Unicode words, no "
                        "stemming)")


def add_commands(sub) -> None:
    ev = sub.add_parser("evaluate", help="score a model or a file of outputs: BLEU, chrF, ROUGE",
                        description="Score a translation model on a test set, or any "
                                    "hypothesis file against its references.")
    kinds = ev.add_subparsers(dest="what", metavar="WHAT")
    kinds.required = True

    tr = kinds.add_parser("translate", help="translate --src and score it against --ref",
                          description="Translate --src and score against --ref: sacreBLEU "
                                      "(detokenised, cased) with its signature, chrF and "
                                      "ROUGE, and the decoding speed.")
    add_model_arg(tr, "a translation run or checkpoint folder")
    tr.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    tr.add_argument("--ref", required=True, help="reference translations, line-aligned")
    tr.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
    tr.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty α")
    tr.add_argument("--batch", type=int, default=64, help="sentences per batch")
    tr.add_argument("--limit", type=int, help="only the first N sentences")
    _add_lang(tr)
    add_out_arg(tr, "write the translations to this file")
    add_runtime_args(tr)
    tr.set_defaults(func=cmd_evaluate_translate)

    tx = kinds.add_parser("text", help="score a hypothesis file against a reference file",
                          description="BLEU, chrF and ROUGE-1/2/L/Lsum of --hyp against --ref, "
                                      "one example a line (\\n inside a line separates an "
                                      "example's sentences, for ROUGE-Lsum).")
    tx.add_argument("--hyp", required=True, help="hypotheses, one a line (plain or .gz)")
    tx.add_argument("--ref", required=True, help="references, line-aligned")
    _add_lang(tx)
    tx.set_defaults(func=cmd_evaluate_text)
