"""attnlab's few-row float kernel against PyTorch's product, over a whole model's matrices.

One decoded token of SmolLM2-135M reads every weight matrix once: its 30 layers' Q/K/V (960 ×
576), output (576 × 576), W₁/W₃ (3072 × 576) and W₂ (576 × 1536), and the 49152 × 576 output
layer, 538 MB in float32, far more than the caches hold. This script times one such pass of
products, ``y = x · Wᵀ`` for ``--rows`` rows of ``x``, by:

* ``torch.ops.attnlab.float_matmul`` (what ``KernelLinear`` runs), row-major ``W``;
* ``torch.nn.functional.linear`` with ``W`` row-major, and stored input-major (what
  ``decoding_layout_`` did before the kernel);
* with ``--dtype bf16``: the same matrices in bfloat16, attnlab's kernel with bf16 ``x`` and
  ``y`` (what a bf16 ``KernelLinear`` runs: ``x`` widened once a call) and with float32 ``x``
  and ``y``, each weight widened to float32 as it is read, against PyTorch's bf16 product;
  and, where the kernels run AVX512-BF16, ``bf16_batch_matmul`` (what a step of 4 or more
  sequences runs: ``x`` rounded to bf16, ``vdpbf16ps``).

Each figure is the best of 5 passes; GB/s is the weights' bytes over the time.

    .venv/bin/python benchmarks/float_kernel.py [--rows 1] [--dtype fp32|bf16] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
SHAPES = LAYER * 30 + [(49152, 576)]


def one_pass(product, weights: list[torch.Tensor], xs: dict[int, torch.Tensor],
             repeats: int = 5) -> float:
    """The fastest of ``repeats`` passes over every matrix, in seconds."""
    times = []
    for _ in range(repeats):
        begun = time.perf_counter()
        for w in weights:
            product(xs[w.shape[1]], w)
        times.append(time.perf_counter() - begun)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from int_kernels import machine_line
    from llamacpp import bandwidth

    print(f"{machine_line(args.threads)}; matrix-vector bandwidth {bandwidth():.1f} GB/s")
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
    xs = {k: torch.randn(args.rows, k, generator=g) for k in {s[1] for s in SHAPES}}
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    ours = torch.ops.attnlab.float_matmul
    for w in weights[:4] + weights[-1:]:  # the same products first
        x = xs[w.shape[1]]
        assert torch.allclose(ours(x, w, None), F.linear(x, w.float()), atol=1e-3, rtol=1e-4)
        if dtype != torch.float32:  # bf16 x: the float64 product of the same values, rounded
            h = x.to(dtype)
            exact = h.double() @ w.double().t()
            assert ((ours(h, w, None).double() - exact).abs() <= 2**-8 * exact.abs() + 1e-4).all()
    half = {k: x.to(dtype) for k, x in xs.items()}
    runs = {"attnlab float_matmul": one_pass(lambda x, w: ours(x, w, None), weights,
                                             xs if dtype == torch.float32 else half)}
    if dtype == torch.float32:
        runs["PyTorch linear, row-major W"] = one_pass(F.linear, weights, xs)
        transposed = [w.t().contiguous().t() for w in weights]
        runs["PyTorch linear, input-major W"] = one_pass(F.linear, transposed, xs)
    else:
        runs["attnlab float_matmul, float32 x (widened)"] = one_pass(
            lambda x, w: ours(x, w, None), weights, xs)
        runs["PyTorch linear, bf16 x"] = one_pass(F.linear, weights, half)
        from attnlab.cpu import kernels as cpu_kernels

        if cpu_kernels.bf16_dot_rows() is not None:
            batch = torch.ops.attnlab.bf16_batch_matmul
            for w in weights[:4] + weights[-1:]:
                x = xs[w.shape[1]]
                want = F.linear(x.to(dtype).float(), w.float())
                assert torch.allclose(batch(x, w, None), want, atol=1e-3, rtol=1e-4)
            runs["attnlab bf16_batch_matmul (x rounded to bf16, vdpbf16ps)"] = one_pass(
                lambda x, w: batch(x, w, None), weights, xs)
    print(f"{len(weights)} matrices, {nbytes / 1e6:.0f} MB of {args.dtype} weights, "
          f"{args.rows} row(s) of x")
    print("| kernel | ms a pass | GB/s | vs attnlab |")
    print("|---|---|---|---|")
    for name, t in runs.items():
        ratio = t / runs["attnlab float_matmul"]
        print(f"| {name} | {t * 1e3:.1f} | {nbytes / t / 1e9:.1f} | {ratio:.2f}x the time |")


if __name__ == "__main__":
    main()
