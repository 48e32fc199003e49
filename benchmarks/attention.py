"""Attention kernels on this machine: torch's fused flash kernel vs torch's math backend vs
attnlab's composed (explicit) equation, forward + backward, causal, fp32 and bf16.

This is the measurement behind the dispatch in ``attnlab.nn.attention``: on CPU, for bf16 and
short sequences, composing softmax(QKᵀ/√d)V from matmuls beats the fused kernel.

    .venv/bin/python benchmarks/attention.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab import hardware
from attnlab.nn.attention import _explicit

SHAPES = [(64, 4, 64, 32), (8, 12, 256, 64), (4, 12, 512, 64), (4, 12, 1024, 64)]


def fused(kind, q, k, v, causal) -> None:
    with sdpa_kernel(kind):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()


def composed(q, k, v, causal) -> None:
    _explicit(q, k, v, causal, None, 0.0)[0].sum().backward()


def timed(fn, repeats: int, *fn_args) -> float:
    fn(*fn_args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*fn_args)
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(hardware.report())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per fwd+bwd")
    print("| dtype | (batch, heads, len, d_k) | flash | math | composed |")
    print("|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for shape in SHAPES:
            q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
            causal = torch.ones(shape[2], shape[2], dtype=torch.bool).tril()

            tensors = (q, k, v, causal)
            times = [timed(fused, args.repeats, SDPBackend.FLASH_ATTENTION, *tensors),
                     timed(fused, args.repeats, SDPBackend.MATH, *tensors),
                     timed(composed, args.repeats, *tensors)]
            name = "bf16" if dtype == torch.bfloat16 else "fp32"
            print(f"| {name} | {shape} | " + " | ".join(f"{t:.1f}" for t in times) + " |")


if __name__ == "__main__":
    main()
