"""Batch-1 decoding of a 1B-parameter Llama on a GPU: attnlab eager and compiled (the one-token
step recorded as a CUDA graph) against transformers eager and with its static cache and
``torch.compile`` (what ``generate`` does itself with ``cache_implementation="static"`` on a
GPU: "reduce-overhead", so CUDA graphs too).

The model has Llama 3.2 1B's shape (16 layers, d_model 2048, d_ff 8192, 32 heads, 8 key/value
heads, 128,256 tokens, tied embeddings: 1.24B parameters) and random weights, built by
transformers and loaded into attnlab through its folder, so both hold the same numbers. Greedy,
a 16-token prompt, 256 new tokens, no early stop, bf16.

    python benchmarks/gpu_decode.py [--new-tokens 256] [--repeats 3] [--json FILE]
    python benchmarks/gpu_decode.py --tiny --device cpu      # the script's own check, no GPU

Per engine: the first call (it compiles, and records the CUDA graphs), then the best of
``--repeats`` timed calls. "MB read" counts the weights once (the tied matrix once) and the KV
cache each engine holds: the static caches are read whole (attnlab's capacity is 512 slots,
transformers' ``max_cache_len`` = prompt + new tokens), the growing ones at the run's mean
length. "Limit" is the bytes over the bandwidth a bf16 matrix-vector product reaches on this
card. "Same tokens" counts how many leading tokens equal transformers' eager output: random
weights give near-flat logits, so bf16 engines part at some near-tie.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
import transformers

from attnlab import from_pretrained, hardware
from attnlab.generation import for_decoding, generate
from attnlab.generation.compiled import BUCKET, CompiledStep, capacity_for

LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                max_position_embeddings=2048, rope_theta=500000.0, tie_word_embeddings=True,
                rms_norm_eps=1e-5)
TINY = dict(LLAMA_1B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matvec_bandwidth(device: torch.device, dtype: torch.dtype) -> float:
    """Bytes a second that one large matrix-vector product reads (best of 10)."""
    rows, cols = (16384, 32768) if device.type == "cuda" else (4096, 4096)
    w = torch.randn(rows, cols, device=device, dtype=dtype)
    x = torch.randn(cols, 1, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(12):
        sync(device)
        start = time.perf_counter()
        w @ x
        sync(device)
        best = min(best, time.perf_counter() - start)
    return w.numel() * w.element_size() / best


def timed(fn, device: torch.device) -> tuple[torch.Tensor, float]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (checks the script)")
    p.add_argument("--engines", nargs="+", default=["transformers", "transformers-static",
                                                    "attnlab", "attnlab-compiled"])
    p.add_argument("--json", help="write the figures here too")
    p.add_argument("--scale", type=float, default=20.0,
                   help="multiply the (tied) embedding by this: random weights give near-flat "
                        "logits, and a scaled head makes choices that bf16 rounding rarely flips")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.precision]
    print(hardware.report())
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.precision}, batch 1, greedy, {args.prompt_len}-token prompt, "
          f"{args.new_tokens} new tokens", flush=True)

    config = transformers.LlamaConfig(**(TINY if args.tiny else LLAMA_1B))
    torch.manual_seed(0)
    with torch.device(device):
        theirs = transformers.LlamaForCausalLM(config).to(dtype).eval()
        with torch.no_grad():
            theirs.get_input_embeddings().weight.mul_(args.scale)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = for_decoding(from_pretrained(folder), device, args.precision)
    weights = sum(t.numel() * t.element_size()
                  for t in {id(t): t for t in theirs.parameters()}.values())
    n_params = sum(t.numel() for t in {id(t): t for t in theirs.parameters()}.values())
    bandwidth = matvec_bandwidth(device, dtype)
    print(f"{n_params / 1e9:.3f}B parameters, {weights / 1e6:,.0f} MB of weights; "
          f"matrix-vector bandwidth {bandwidth / 1e9:,.0f} GB/s", flush=True)

    n, plen = args.new_tokens, args.prompt_len
    prompt = torch.randint(10, config.vocab_size, (1, plen),
                           generator=torch.Generator().manual_seed(0)).to(device)
    theirs.generation_config.eos_token_id = None
    theirs.generation_config.pad_token_id = 0
    hf = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False)
    step = CompiledStep()
    runs = {
        "transformers": lambda: theirs.generate(prompt, **hf),
        "transformers-static": lambda: theirs.generate(prompt, cache_implementation="static",
                                                       **hf),
        "attnlab": lambda: generate(ours, prompt, n),
        "attnlab-compiled": lambda: generate(ours, prompt, n, compiled=step),
    }
    kv_token = (2 * config.num_hidden_layers * config.num_key_value_heads
                * (config.hidden_size // config.num_attention_heads) * torch.finfo(dtype).bits // 8)
    slots = {"transformers": plen + n / 2, "attnlab": plen + n / 2,
             "transformers-static": plen + n,
             "attnlab-compiled": capacity_for(plen + n - 1, None, BUCKET)}
    rows, outs = [], {}
    for name in args.engines:
        first_out, first = timed(runs[name], device)
        best = float("inf")
        for _ in range(args.repeats):
            out, seconds = timed(runs[name], device)
            best = min(best, seconds)
            if not torch.equal(out, first_out):  # (the first call may run eagerly)
                print(f"  {name}: the first call's tokens differ from a timed call's")
        outs[name] = out[0, plen:].cpu()
        read = weights + kv_token * slots[name]
        rows.append(dict(engine=name, first_call_s=first, tokens_per_s=n / best,
                         mb_read=read / 1e6, limit=bandwidth / read))
        print(f"  {name}: first call {first:.1f} s, {n / best:,.1f} tokens/s", flush=True)

    reference = outs.get("transformers", next(iter(outs.values())))
    print("| engine | first call (compile) | tokens/s | ms a token | MB read a token | "
          "limit tokens/s | % of limit | same tokens as transformers eager |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        same = int((outs[row["engine"]] == reference).long().cumprod(0).sum())
        row["same_tokens"] = same
        print(f"| {row['engine']} | {row['first_call_s']:.1f} s | {row['tokens_per_s']:,.1f} | "
              f"{1000 / row['tokens_per_s']:.2f} | {row['mb_read']:,.0f} | {row['limit']:,.0f} | "
              f"{row['tokens_per_s'] / row['limit']:.0%} | {same}/{n} |")
    rate = {r["engine"]: r["tokens_per_s"] for r in rows}
    if "attnlab-compiled" in rate and "transformers-static" in rate:
        print(f"attnlab compiled / transformers static+compile: "
              f"{rate['attnlab-compiled'] / rate['transformers-static']:.2f}x")
    from torch._dynamo.utils import counters

    print(f"attnlab's compiled step: {step.compiles} graph(s), {step.compile_seconds:.1f} s; "
          f"steps that skipped CUDA graphs: {counters['inductor']['cudagraph_skips']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, bandwidth=bandwidth, weights=weights,
                           device=hardware.report()), f, indent=1)


if __name__ == "__main__":
    main()
