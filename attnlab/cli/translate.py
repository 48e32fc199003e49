"""``attnlab translate``: sentences through a trained translator, greedy, by beam search, or
sampled as ``generate`` samples (``--temperature``, ``--top-k``, ``--top-p``, ``--seed``).
(Scoring one on a test set is ``attnlab evaluate translate``, in :mod:`attnlab.cli.evaluate`.)"""

from __future__ import annotations

import argparse

from attnlab.cli.common import (
    UsageError,
    add_compile_arg,
    add_model_arg,
    add_runtime_args,
    add_sampling_args,
    announce,
    compiled_step,
    load_for,
    sampling_seed,
    texts,
    translation_beam,
    warn_unknown,
)


def cmd_translate(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.generation.seq2seq import translate

    beam = translation_beam(args, default=1)
    empty = [i for i, text in enumerate(args.text, 1) if not text.strip()]
    if empty:  # checked before the model loads; a translation of nothing is made up
        raise UsageError(f"sentence {empty[0]} is empty: give the text to translate")
    loaded, device, precision = load_for(args, "encoder-decoder")
    sentences = texts(args, required=False)
    warn_unknown(loaded.tokenizers["source"], sentences, "input")
    announce(args, loaded.path, device, precision)
    generator = None
    if args.temperature > 0:  # as generate: a fresh seed is printed, --seed repeats a run
        import torch

        generator = torch.Generator(device=device).manual_seed(sampling_seed(args))
    with hardware.autocast(device, precision):
        hyps = translate(loaded.model, loaded.tokenizers["source"], loaded.tokenizers["target"],
                         sentences, beam_size=beam, alpha=args.alpha,
                         compiled=compiled_step(args, encoder_decoder=True),
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                         generator=generator)
    for hyp in hyps:
        print(hyp)


def add_commands(sub) -> None:
    tr = sub.add_parser("translate", help="translate with a trained model",
                        description="Translate the given sentences, or stdin line by line.")
    add_model_arg(tr, "a translation run or checkpoint folder")
    tr.add_argument("text", nargs="*", help="sentences (default: read stdin)")
    tr.add_argument("--beam", type=int,
                    help="beam size (default 1: greedy, or sampled with --temperature)")
    tr.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty α")
    add_sampling_args(tr, temperature=None)
    add_compile_arg(tr)
    add_runtime_args(tr)
    tr.set_defaults(func=cmd_translate)
