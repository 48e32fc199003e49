"""Where one decoded token's time goes: SmolLM2-135M at batch 1, each operation's time and the
bytes it reads (#25 item 2's per-op profile).

After the prompt and three warm-up steps (with ``--compile``, the compile happens there), the
model decodes ``--tokens`` greedy tokens one step at a time under ``torch.profiler``, and the
top-level events are grouped by operation. The compiled step's own C++ kernels are named by
inductor (``cpp_fused_...``: the norms, RoPE, SwiGLU and residual adds fused together); matrix
products and attention stay ATen calls. For each group: calls and microseconds per token, the
share of the step, the megabytes its tensor inputs take (matrix products: the weight they
read; attention: the KV cache; not counted for other ops) and the rate that makes (MB /
time). The bandwidth line is this machine's matrix-vector rate, as ``benchmarks/llamacpp.py``
measures it.

    .venv/bin/python benchmarks/profile_decode.py --precision fp32|bf16|int4|int8 [--compile]
        [--tokens 32] [--capacity 512] [--rows 1]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the itemsize of each input of the integer kernels, in order (None: the activations')
ITEMSIZE = {"attnlab::int4_matmul": (4, 1, 2, 2),  # x, codes two a byte, f16 scales, offsets
            "attnlab::int8_matmul": (4, 1, 4),  # x, int8 codes, float32 scales
            "int4": (None, 1, None, 2),  # PyTorch's: x, codes, group size, bf16 scales+zeros
            "_weight_int8pack_mm": (None, 1, None)}


READS_ITS_INPUTS = ("linear", "mm", "addmm", "_weight_int", "int4", "int8_matmul", "float_matmul",
                    "scaled_dot_product", "_flash_")


def input_bytes(name: str, shapes: list, itemsize: int) -> int:
    """The bytes of a matrix product's or an attention's tensor inputs (the weights, the KV
    cache), at the activations' ``itemsize`` unless the op's inputs are known to be packed
    codes (uint8 weights, bf16 scales); 0 for other ops (an indexing op's input is a whole
    table of which it reads a row)."""
    if not any(key in name for key in READS_ITS_INPUTS):
        return 0
    sizes = next((v for k, v in ITEMSIZE.items() if k in name), ())
    total = 0
    for i, shape in enumerate(shapes):
        if not shape or not all(isinstance(n, int) for n in shape):
            continue
        size = sizes[i] if i < len(sizes) and sizes[i] is not None else itemsize
        numel = 1
        for n in shape:
            numel *= n
        total += numel * size
    return total


def group(name: str) -> str:
    if "cpp_fused" in name:
        return "inductor's C++ kernels (norms, RoPE, SwiGLU, masks, adds: fused)"
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=["fp32", "bf16", "int4", "int8"],
                   default="fp32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--capacity", type=int, default=None,
                   help="the static cache's slots (default: the bucket the tokens need)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=1,
                   help="decode this many copies of the prompt as one batch")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch._inductor.config.cpp.enable_kernel_profile = True  # name each C++ kernel

    import attnlab
    from attnlab.cpu import for_decoding
    from attnlab.generation.compiled import CompiledStep, StaticDecoding, capacity_for
    from attnlab.nn.quantized import float_dtype
    from attnlab.storage import smollm2_path

    sys.path.insert(0, str(Path(__file__).parent))
    from llamacpp import bandwidth

    int4, int8 = args.precision == "int4", args.precision == "int8"
    loaded = attnlab.load(str(smollm2_path()), int4=int4, int8=int8)
    model = for_decoding(loaded.model, "cpu", "bf16" if int4 or int8 else args.precision,
                         int4 or int8, rows=args.rows)
    prompt = torch.tensor([loaded.tokenizer.encode("The history of Paris begins")] * args.rows)
    warm, n = 3, args.tokens
    with torch.no_grad():
        cache = model.new_cache(capacity=prompt.shape[1] + warm + n, rolling=False)
        token = model(prompt, cache=cache)[:, -1:].argmax(-1)  # the prompt, not profiled
        if args.compile:
            static = StaticDecoding(CompiledStep(), cache, None, prompt.shape[1],
                                    args.capacity or capacity_for(prompt.shape[1] + warm + n,
                                                                  model.config.context))

            def step(t):
                return static(model, t)
        else:
            def step(t):
                return model(t, cache=cache)[:, -1]

        for _ in range(warm):  # allocations, and the compile
            token = step(token).argmax(-1, keepdim=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            begun = time.perf_counter()
            for _ in range(n):
                token = step(token).argmax(-1, keepdim=True)
            seconds = time.perf_counter() - begun
    itemsize = (float_dtype() if int4 or int8 else  # around them
                torch.bfloat16 if args.precision == "bf16" else torch.float32).itemsize
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    inside = 0.0  # the time of the ops inside compiled regions
    for event in prof.events():
        parent = event.cpu_parent
        in_graph = parent is not None and parent.name.startswith("## Call CompiledFxGraph")
        if event.name.startswith("Torch-Compiled Region"):
            table["compiled region's own work (guards, wrappers, graph entry)"][1] += \
                event.cpu_time_total
            continue
        if (parent is not None and not in_graph) or event.name.startswith("## Call Compiled"):
            continue  # inside an op counted already, or the graph's call (its ops count)
        row = table[group(event.name)]
        row[0] += 1
        row[1] += event.cpu_time_total
        row[2] += input_bytes(event.name, event.input_shapes or [], itemsize)
        inside += event.cpu_time_total if in_graph else 0.0
    own = "compiled region's own work (guards, wrappers, graph entry)"
    if inside and own in table:
        table[own][1] -= inside
    table.pop(own, None)  # (a graph compiled ahead has no such region: measured as the rest)
    tokens = n
    # the rest: the step's wall time that no op's event covers (Dynamo's lookup and guards,
    # the wrapper between kernels, the Python loop)
    table["the rest: guards, wrappers, the loop (wall time not in an op)"][1] = max(
        0.0, seconds * 1e6 - sum(r[1] for r in table.values()))
    step_us = sum(r[1] for r in table.values()) / tokens
    bw = bandwidth()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} threads; matrix-vector bandwidth {bw:.1f} GB/s")
    print(f"# SmolLM2-135M {args.precision}{' compiled' if args.compile else ' eager'}: "
          f"{args.rows} row(s), {tokens} steps in {seconds:.2f} s "
          f"({tokens * args.rows / seconds:.1f} tokens/s, profiler on); "
          f"{step_us / 1000:.2f} ms a token")
    print("| op | calls/token | µs/token | share | MB read/token | GB/s |")
    print("|---|---|---|---|---|---|")
    for name, (calls, us, nbytes) in sorted(table.items(), key=lambda kv: -kv[1][1])[:14]:
        us_tok, mb = us / tokens, nbytes / tokens / 1e6
        rate = f"{mb / us_tok * 1e3:.1f}" if mb > 0.01 else ""
        print(f"| {name} | {calls / tokens:.1f} | {us_tok:.0f} | {us_tok / step_us:.0%} | "
              f"{mb:.1f} | {rate} |")


if __name__ == "__main__":
    main()
