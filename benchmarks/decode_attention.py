"""attnlab's one-query attention against PyTorch's fused kernel on a static KV cache.

A compiled decoding step attends over a static cache of ``capacity`` slots, of which the first
``used`` hold tokens (the mask allows those). PyTorch's ``scaled_dot_product_attention`` reads
every slot; ``torch.ops.attnlab.decode_attention`` stops at the last allowed one. SmolLM2-135M's
shapes: 9 query heads, 3 key/value heads of 64, batch 1, float32. Each figure is the best of
7 runs, in µs per call (one layer); the output difference is the largest |ours − theirs|.

    .venv/bin/python benchmarks/decode_attention.py [--threads 2] [--capacity 512]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--capacity", type=int, default=512)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from int_kernels import best, machine_line

    print(f"{machine_line(args.threads)}; capacity {args.capacity}, 9 heads, 3 kv heads of 64")
    print("| used slots | PyTorch SDPA µs | attnlab µs | ratio | max difference |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 1, 64, generator=g)
    k = torch.randn(1, 3, args.capacity, 64, generator=g)
    v = torch.randn(1, 3, args.capacity, 64, generator=g)
    for used in (16, 64, 128, 256, args.capacity):
        mask = torch.zeros(1, 1, 1, args.capacity, dtype=torch.bool)
        mask[..., :used] = True
        theirs = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v,
                                   attn_mask=mask, enable_gqa=True)
        ours = functools.partial(torch.ops.attnlab.decode_attention, q, k, v,
                                 mask.view(1, -1), 64 ** -0.5)
        t_theirs, t_ours = best(theirs), best(ours)
        diff = (ours() - theirs()).abs().max().item()
        print(f"| {used} | {t_theirs * 1e6:.0f} | {t_ours * 1e6:.0f} | "
              f"{t_theirs / t_ours:.1f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
