"""Compiled bf16 against compiled fp32 decoding, one process: SmolLM2-135M at batch 1 (#25's
bf16 target, at least 1.7x fp32 where bf16 is native).

Both models are loaded, compiled and warmed first; then rounds of ``--tokens`` greedy tokens
alternate between them, so that each ratio compares rounds seconds apart on a shared machine
(separate processes minutes apart moved by up to 20%). With ``--full-guards`` each precision also
runs a copy of its loop that makes Dynamo check every guard at every token (what a request's
first step does), to measure what checking only the guards that tell graphs apart saves; with
``--cpp-wrapper``, a copy compiled with inductor's C++ wrapper (the graph's calls made from C++,
not from a Python function).

With ``--16-bit-activations`` each 16-bit or integer precision also runs as it decoded before
the seventh pass: every float tensor but the integer codes in bfloat16, so the activations and
the KV cache are bf16 too (now they are float32 around the 16-bit matrices,
``float32_activations_``); with ``--bf16-kv-cache``, also with a bf16 KV cache
(``for_decoding(…, kv_cache="bf16")``). ``--prompt N`` starts each loop after N tokens of
context (a long conversation: the KV cache's bytes grow with it). ``--same-tokens N`` first
compares, for each loop's model, N greedy tokens of eager ``generate`` and of ``generate`` with
the compiled step.

    .venv/bin/python benchmarks/precision_decode.py [--rounds 5] [--tokens 64] [--full-guards]
        [--cpp-wrapper] [--16-bit-activations] [--bf16-kv-cache] [--prompt 0]
        [--same-tokens 0]
        [--precisions fp32 bf16 int4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--full-guards", action="store_true")
    p.add_argument("--cpp-wrapper", action="store_true")
    p.add_argument("--16-bit-activations", dest="lowp", action="store_true")
    p.add_argument("--bf16-kv-cache", dest="bf16_kv", action="store_true")
    p.add_argument("--prompt", type=int, default=0, help="tokens of context before the loops")
    p.add_argument("--same-tokens", type=int, default=0)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                   choices=["fp32", "bf16", "int4"],
                   help="int4: the file's Q4_1 codes, float_dtype() around them")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import attnlab
    from attnlab import hardware
    from attnlab.cpu import for_decoding
    from attnlab.generation.compiled import CompiledStep, StaticDecoding, capacity_for
    from attnlab.generation.decode import generate
    from attnlab.storage import smollm2_path

    sys.path.insert(0, str(Path(__file__).parent))
    from int_kernels import machine_line

    class EveryGuard(StaticDecoding):  # forgets the last model: every step checks all guards
        def __call__(self, model, token):
            self.model = None
            return super().__call__(model, token)

    class CppWrapper(CompiledStep):  # the same step, its graph called from C++
        def _for(self, args):
            if "cpu" not in self._compiled:
                options = {"size_asserts": False, "alignment_asserts": False,
                           "cpp_wrapper": True}
                self._compiled["cpu"] = (torch.compile(self.function, dynamic=False,
                                                       fullgraph=True, options=options), False)
            return self._compiled["cpu"]

    print(f"{machine_line(args.threads)}; native bf16: {hardware.cpu_bf16().reason}")
    length = args.rounds * args.tokens + 8
    loops = {}
    models = []
    for precision in args.precisions:
        int4 = precision == "int4"
        versions = [""] + (["16-bit activations"] if args.lowp and precision != "fp32" else [])
        versions += ["bf16 KV cache"] if args.bf16_kv and precision != "fp32" else []
        for version in versions:
            loaded = attnlab.load(str(smollm2_path()), int4=int4)
            model = for_decoding(loaded.model, "cpu", "bf16" if int4 else precision, int4,
                                 kv_cache="bf16" if version == "bf16 KV cache" else None)
            if version == "16-bit activations":
                model = sixteen_bit_activations(model)
            models.append((precision + (f", {version}" if version else ""), model,
                           loaded.tokenizer))
    with torch.no_grad():
        for name, model, tokenizer in models:
            prompt = torch.tensor([tokenizer.encode("The history of Paris begins")])
            if args.prompt:  # some context: token ids from the vocabulary, a fixed seed
                prompt = torch.randint(100, 20000, (1, args.prompt),
                                       generator=torch.Generator().manual_seed(0))
            if args.same_tokens:  # (its own step: no reset, which would drop the loops' graphs)
                eager = generate(model, prompt, args.same_tokens)[0].tolist()
                compiled = generate(model, prompt, args.same_tokens,
                                    compiled=CompiledStep())[0].tolist()
                same = next((i for i, (a, b) in enumerate(zip(eager, compiled, strict=True))
                             if a != b), len(eager)) - prompt.shape[1]
                print(f"{name}: compiled and eager give the same first {same} of "
                      f"{args.same_tokens} greedy tokens", flush=True)
            kinds = [("", StaticDecoding, CompiledStep())]
            if args.full_guards:
                kinds.append((", every guard", EveryGuard, kinds[0][2]))
            if args.cpp_wrapper:
                kinds.append((", C++ wrapper", StaticDecoding, CppWrapper()))
            for label, kind, step in kinds:
                cache = model.new_cache(capacity=prompt.shape[1] + length, rolling=False)
                token = model(prompt, cache=cache)[:, -1:].argmax(-1)
                loop = kind(step, cache, None, prompt.shape[1],
                            capacity_for(prompt.shape[1] + length, model.config.context))
                for _ in range(3):  # the compile, then the allocations
                    token = loop(model, token).argmax(-1, keepdim=True)
                loops[name + label] = [model, loop, token, []]
        for _ in range(args.rounds):
            for entry in loops.values():
                model, loop, token, rates = entry
                begun = time.perf_counter()
                for _ in range(args.tokens):
                    token = loop(model, token).argmax(-1, keepdim=True)
                rates.append(args.tokens / (time.perf_counter() - begun))
                entry[2] = token
    print(f"| loop | tokens/s, {args.rounds} rounds of {args.tokens} | median |")
    print("|---|---|---|")
    for name, (_, _, _, rates) in loops.items():
        print(f"| {name} | {', '.join(f'{r:.1f}' for r in rates)} | "
              f"{sorted(rates)[len(rates) // 2]:.1f} |")
    for name, (_, loop, _, _) in loops.items():
        if loop.step.guard_misses:  # (none expected: nothing here resets Dynamo)
            print(f"{name}: {loop.step.guard_misses} later steps matched no graph on the "
                  "differentiating guards and checked them all")
    for name in loops:
        if name != "fp32" and "fp32" in loops:
            ratios = [b / f for b, f in zip(loops[name][3], loops["fp32"][3], strict=True)]
            print(f"{name} / fp32 in each round: {', '.join(f'{r:.2f}' for r in ratios)} "
                  f"(median {sorted(ratios)[len(ratios) // 2]:.2f}x"
                  + ("; the target is 1.7x)" if name == "bf16" else ")"))
        for version in ("16-bit activations", "bf16 KV cache"):
            if name.endswith(f", {version}"):
                ours = loops[name.removesuffix(f", {version}")][3]
                ratios = [a / b for a, b in zip(ours, loops[name][3], strict=True)]
                print(f"{name.split(',')[0]} / {name} in each round: "
                      f"{', '.join(f'{r:.2f}' for r in ratios)} "
                      f"(median {sorted(ratios)[len(ratios) // 2]:.2f}x)")


def sixteen_bit_activations(model):
    """``model`` (from ``for_decoding``) as it decoded before float32 activations: every float
    parameter and buffer outside the integer layers in bfloat16, the embedding's rows too."""

    from attnlab.nn.embeddings import TokenEmbedding
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            continue
        for t in m.parameters(recurse=False):
            if t.is_floating_point():
                t.data = t.data.bfloat16()
        for name, t in list(m.named_buffers(recurse=False)):
            if t.is_floating_point():
                m._buffers[name] = t.bfloat16()
        if isinstance(m, TokenEmbedding):
            m.out_dtype = None
    return model


if __name__ == "__main__":
    main()
