"""Peak memory of one forward pass at n = 4,096 tokens: Longformer's band against full
attention, on the same model.

The model is longformer-base-4096's shape (RoBERTa's layout, d_model 768, 12 heads, d_ff
3072) with 2 of its 12 layers by default: inference keeps nothing of a finished layer, so a
pass's peak is one layer's and does not grow with depth (``--layers 12`` shows it, slowly).
Random weights, batch 1, inference mode, float32, the first token global. Each variant runs in
a process of its own:

    longformer     attnlab, attention_window=512 (256 tokens each side, and the global [CLS])
    full           the same config with attention_window=None: attnlab's ordinary attention,
                   torch's fused kernel (which on a CPU never holds the n × n scores either)
    full-math      the same, under torch's math kernel: the n × n scores of a head written out
    transformers   transformers' LongformerModel, the same config and window (the peer)

The method: the process builds its model and runs a pass of 16 tokens (kernels loaded), resets
its peak resident set (``/proc/self/clear_refs``) and reads it (``VmHWM``) after one pass of n
tokens; the figure is that peak minus the resident set before the pass: what the pass added,
the weights excluded. Linux only.

    .venv/bin/python benchmarks/longformer_memory.py [--n 4096] [--layers 2] [--window 512]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

VARIANTS = ("longformer", "full", "full-math", "transformers")


def memory_kb() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", status).group(1)) for k in ("VmRSS", "VmHWM")}


def build(variant: str, layers: int, window: int, n: int):
    """A forward function of ``ids`` for the variant's model."""
    if variant == "transformers":
        import transformers

        transformers.logging.set_verbosity_error()
        config = transformers.LongformerConfig(num_hidden_layers=layers, attention_window=window,
                                               max_position_embeddings=n + 2, vocab_size=50265,
                                               type_vocab_size=1)
        model = transformers.LongformerModel(config, add_pooling_layer=False).eval()
        return lambda ids, glob: model(input_ids=ids, global_attention_mask=glob)
    from attnlab import ModelConfig, build_model

    banded = window if variant == "longformer" else None
    config = ModelConfig.from_preset("roberta-base", n_encoder_layers=layers, max_len=n + 2,
                                     attention_window=banded)
    model = build_model(config).eval()
    if variant == "full-math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run(ids, glob):
            with sdpa_kernel(SDPBackend.MATH):
                return model.encode(ids)
        return run
    return lambda ids, glob: model.encode(ids, global_attention_mask=glob)


def measure(variant: str, layers: int, window: int, n: int) -> dict:
    """One variant in this process: the memory its pass of n tokens adds, and its time."""
    torch.manual_seed(0)
    forward = build(variant, layers, window, n)
    with torch.inference_mode():
        ids = torch.randint(5, 50000, (1, n))
        glob = torch.zeros_like(ids)
        glob[:, 0] = 1
        forward(ids[:, :16], glob[:, :16])  # kernels loaded; little memory left to reuse
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
        before = memory_kb()["VmRSS"]
        begun = time.perf_counter()
        forward(ids, glob)
        seconds = time.perf_counter() - begun
        peak = memory_kb()["VmHWM"]
    return {"variant": variant, "peak_mb": (peak - before) / 1024, "before_mb": before / 1024,
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--variant", choices=VARIANTS, help="run one variant here (internal)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.layers, args.window, args.n)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from int_kernels import machine_line

    print(f"{machine_line(torch.get_num_threads())}; n={args.n}, batch 1, {args.layers} layers "
          f"of d_model 768, 12 heads, d_ff 3072, attention_window={args.window}, float32")
    print("| variant | peak memory added by the pass | resident before it | the pass |")
    print("|---|---|---|---|")
    rows = {}
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--variant", variant, "--n", str(args.n),
                              "--layers", str(args.layers), "--window", str(args.window)],
                             check=True, capture_output=True, text=True).stdout
        rows[variant] = json.loads(out.strip().splitlines()[-1])
        r = rows[variant]
        print(f"| {variant} | {r['peak_mb']:,.0f} MB | {r['before_mb']:,.0f} MB | "
              f"{r['seconds']:.1f} s |", flush=True)
    band, full = rows["longformer"]["peak_mb"], rows["full-math"]["peak_mb"]
    print(f"longformer / full-math peak: {band / full:.2f}")


if __name__ == "__main__":
    main()
