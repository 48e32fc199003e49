"""attnlab's integer kernels against PyTorch's, one matrix-vector product at a time.

For each of SmolLM2-135M's matrix shapes (and one large matrix, where the threads' start-up
no longer counts), the time of ``y = x · Ŵᵀ`` for one row ``x`` by:

* int8, one scale per row: ``torch.ops.attnlab.int8_matmul`` (float32 activations) and
  PyTorch's ``_weight_int8pack_mm`` (bf16 activations, what attnlab ran before);
* int4 in groups of 32: ``torch.ops.attnlab.int4_matmul`` (activations rounded to 16 bits per
  32 inputs, float16 scales and offsets) and PyTorch's ``_weight_int4pack_mm_for_cpu`` (bf16
  activations, bf16 scales and zeros);
* float32 ``torch.nn.functional.linear`` for reference.

Each figure is the best of 7 runs; GB/s counts the bytes each kernel reads (codes and scales).
The machine's matrix-vector bandwidth is measured as ``benchmarks/llamacpp.py`` does.

``--model-pass`` times instead what one decoded token of an int4 SmolLM2 asks of the int4
kernel: one row through each of its 120 matrices as ``for_decoding`` stacks them (Q/K/V 960 ×
576, output 576 × 576, W₁/W₃ 3072 × 576, W₂ 576 × 1536; 66 MB, past the caches), one thread
and ``--threads``, best of 9 passes.

    .venv/bin/python benchmarks/int_kernels.py [--threads 2] [--model-pass]
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (8192, 4096)]


def best(fn, seconds: float = 0.2) -> float:
    """The fastest mean time of one call over 7 runs of about ``seconds`` each."""
    fn()
    begun, calls = time.perf_counter(), 0
    while time.perf_counter() - begun < seconds / 4:
        fn()
        calls += 1
    calls = max(3, calls * 4)
    times = []
    for _ in range(7):
        begun = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - begun) / calls)
    return min(times)


def machine_line(threads: int) -> str:
    """The kernels built (or exit), and the line that says where the figures come from."""
    from attnlab.cpu import kernels as cpu_kernels

    if not cpu_kernels.available():
        raise SystemExit("attnlab's CPU kernels could not be built here")
    return (f"# {platform.processor() or platform.machine()}, "
            f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
            f"{threads} threads")


def model_pass(threads: int) -> None:
    """One row through each of an int4 SmolLM2's 120 stacked matrices, at 1 and ``threads``."""
    layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    g = torch.Generator().manual_seed(0)
    matrices = []
    for out_f, in_f in layer * 30:
        packed = torch.randint(0, 256, (out_f, in_f // 2), generator=g, dtype=torch.uint8)
        s4 = (torch.rand(out_f, in_f // 32, generator=g) / 100).half()
        matrices.append((packed, s4, s4.clone()))
    nbytes = sum(p.numel() + s.numel() * 4 for p, s, _ in matrices)
    xs = {k: torch.randn(1, k, generator=g) for k in (576, 1536)}
    op = torch.ops.attnlab.int4_matmul

    def one() -> None:
        for packed, s4, b4 in matrices:
            op(xs[packed.shape[1] * 2], packed, s4, b4, 32)

    print(f"int4 kernel, one token's 120 matrices of SmolLM2 ({nbytes / 1e6:.1f} MB):")
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        one()
        times = []
        for _ in range(9):
            begun = time.perf_counter()
            one()
            times.append(time.perf_counter() - begun)
        t = min(times)
        print(f"  {n} thread(s): {t * 1e3:.2f} ms a pass, {nbytes / t / 1e9:.1f} GB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model-pass", action="store_true",
                   help="one token's worth of int4 SmolLM2 products instead of each shape")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from llamacpp import bandwidth

    print(f"{machine_line(args.threads)}; matrix-vector bandwidth {bandwidth():.1f} GB/s")
    if args.model_pass:
        model_pass(args.threads)
        return
    print("| out × in | fp32 linear µs (GB/s) | int8 PyTorch µs (GB/s) | int8 attnlab µs (GB/s) "
          "| int4 PyTorch µs (GB/s) | int4 attnlab µs (GB/s) |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in SHAPES:
        x = torch.randn(1, in_f, generator=g)
        w = torch.randn(out_f, in_f, generator=g)
        q8 = torch.randint(-127, 128, (out_f, in_f), generator=g, dtype=torch.int8)
        s8 = torch.rand(out_f, generator=g) + 0.5
        codes = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.int32)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
        s4 = torch.rand(out_f, in_f // 32, generator=g).half()
        b4 = torch.rand(out_f, in_f // 32, generator=g).half()
        theirs4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = torch.stack([s4, b4], -1).transpose(0, 1).to(torch.bfloat16).contiguous()
        xb = x.to(torch.bfloat16)
        groups = out_f * in_f // 32
        ops = torch.ops
        runs = [  # (kernel, its arguments, the bytes it reads)
            (torch.nn.functional.linear, (x, w), out_f * in_f * 4),
            (ops.aten._weight_int8pack_mm, (xb, q8, s8.to(torch.bfloat16)), out_f * in_f),
            (ops.attnlab.int8_matmul, (x, q8, s8[:, None], in_f), out_f * in_f),
            (ops.aten._weight_int4pack_mm_for_cpu, (xb, theirs4, 32, sz),
             out_f * in_f // 2 + groups * 4),
            (ops.attnlab.int4_matmul, (x, packed, s4, b4, 32), out_f * in_f // 2 + groups * 4),
        ]
        cells = []
        for kernel, operands, nbytes in runs:
            t = best(functools.partial(kernel, *operands))
            cells.append(f"{t * 1e6:.0f} ({nbytes / t / 1e9:.1f})")
        print(f"| {out_f} × {in_f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
