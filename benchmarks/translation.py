"""Encoder–decoder speed, side by side in one process: attnlab vs transformers' MarianMTModel
(same weights, loaded from the folder attnlab writes) and vs torch.nn.Transformer (same
dimensions), on the same batches.

Training: tokens/s (source + target real tokens) of forward + label-smoothed loss + backward +
Adam, the models alternating step by step. Decoding: sentences/s of greedy and beam-4 search
(GNMT α = 0.6 for attnlab; transformers' length_penalty = 0.6) on the same sources, with the
same maximum length; with random weights neither stops early, so both do the same work.

    .venv/bin/python benchmarks/translation.py [--steps 20] [--decode 64]
        [--compile] [--decode-only] [--precisions fp32 bf16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from attnlab import ModelConfig, Transformer, hardware, save_pretrained
from attnlab.generation import beam_search, greedy_decode
from attnlab.generation.compiled import CompiledStep, encoder_decoder_token

sys.path.insert(0, str(Path(__file__).parent))
from train_throughput import TorchTransformer, make_batches, step  # noqa: E402


class Marian(torch.nn.Module):
    """MarianMTModel behind attnlab's ``model(src, tgt) -> logits`` signature."""

    def __init__(self, hf, pad_id):
        super().__init__()
        self.hf, self.pad_id = hf, pad_id

    def forward(self, src, tgt):
        return self.hf(input_ids=src, attention_mask=(src != self.pad_id).long(),
                       decoder_input_ids=tgt).logits


def models(cfg):
    torch.manual_seed(0)
    ours = Transformer(cfg)
    folder = tempfile.mkdtemp(prefix="marian-bench-")
    save_pretrained(ours, folder)
    hf = transformers.MarianMTModel.from_pretrained(folder)
    return ours, Marian(hf, cfg.pad_id), TorchTransformer(cfg)


def train_speed(cfg, batches, warmup, bf16):
    ours, marian, torch_tf = models(cfg)
    named = {"attnlab": ours, "transformers Marian": marian, "torch.nn.Transformer": torch_tf}
    for m in named.values():
        m.train()
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            for k, m in named.items()}
    seconds, tokens = dict.fromkeys(named, 0.0), dict.fromkeys(named, 0)
    for i, (src, tgt) in enumerate(batches):
        for name, model in named.items():
            t0 = time.perf_counter()
            n = step(model, opts[name], src, tgt, bf16)
            if i >= warmup:
                seconds[name] += time.perf_counter() - t0
                tokens[name] += n
    return {k: tokens[k] / seconds[k] for k in named}


@torch.no_grad()
def decode_speed(cfg, src, max_len, bf16, compile=False):
    """Sentences/s of each engine, greedy and beam 4. ``compile``: attnlab's compiled
    one-token step joins (its compile in a warm-up, reported, not timed; its tokens are
    checked against eager attnlab's)."""
    ours, marian, _ = models(cfg)
    hf = marian.hf.eval()
    ours.eval()
    if bf16:
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
    mask = (src != cfg.pad_id).long()
    step = CompiledStep(function=encoder_decoder_token) if compile else None
    rows = {}
    for beam in (1, 4):
        def run_ours(beam=beam, compiled=None):
            return (greedy_decode(ours, src, max_len=max_len, compiled=compiled) if beam == 1
                    else beam_search(ours, src, beam, 0.6, max_len=max_len, compiled=compiled))

        def run_theirs(beam=beam):
            return hf.generate(src, attention_mask=mask, num_beams=beam, do_sample=False,
                               max_length=max_len, length_penalty=0.6, early_stopping=True)

        engines = [("attnlab", run_ours), ("transformers", run_theirs)]
        if step is not None:
            begun, compiles = time.perf_counter(), step.compile_seconds
            same = torch.equal(run_ours(compiled=step), run_ours())  # warm-up: the compile
            print(f"  beam {beam}: compiled in {step.compile_seconds - compiles:.1f} s "
                  f"(warm-up {time.perf_counter() - begun:.1f} s); the same tokens as eager: "
                  f"{same}", flush=True)
            engines.append(("attnlab compiled", lambda beam=beam: run_ours(beam, step)))
        times = dict.fromkeys([name for name, _ in engines], 0.0)
        for _ in range(2):  # alternate, twice; the first round also warms up
            for name, fn in engines:
                t0 = time.perf_counter()
                out = fn()
                times[name] += time.perf_counter() - t0
                assert out.shape[1] == max_len, "both should run to max_len"
        rows[beam] = {k: 2 * len(src) / v for k, v in times.items()}
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--decode", type=int, default=64, help="sentences to decode")
    p.add_argument("--max-len", type=int, default=40, help="decoded length (with bos)")
    p.add_argument("--compile", action="store_true",
                   help="decoding: attnlab's compiled one-token step joins")
    p.add_argument("--decode-only", action="store_true", help="skip the training figures")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    args = p.parse_args()
    print(hardware.report())
    # The `small` preset in Marian's shape (sines-then-cosines positions, an output bias).
    cfg = ModelConfig.from_preset("small", dropout=0.1, positional="sinusoidal-split",
                                  output_bias=True, bos_id=0)
    print(f"d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, "
          f"{cfg.n_heads} heads, d_ff {cfg.d_ff}, vocab {cfg.vocab_size}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    batches = make_batches(cfg, args.steps + args.warmup, args.batch, args.len)
    print(f"\ntraining tokens/s (batch {args.batch} x {args.len})")
    print("| precision | attnlab | transformers Marian | torch.nn.Transformer | vs Marian | "
          "vs torch |\n|---|---|---|---|---|---|")
    for bf16 in [p == "bf16" for p in args.precisions if not args.decode_only]:
        r = train_speed(cfg, batches, args.warmup, bf16)
        a, m, t = r["attnlab"], r["transformers Marian"], r["torch.nn.Transformer"]
        print(f"| {'bf16' if bf16 else 'fp32'} | {a:,.0f} | {m:,.0f} | {t:,.0f} | "
              f"{a / m:.2f}x | {a / t:.2f}x |", flush=True)
    src = make_batches(cfg, 1, args.decode, 20, seed=7)[0][0]
    print(f"\ndecoding sentences/s ({args.decode} sources of up to 20 tokens, "
          f"{args.max_len} tokens out)")
    extra = " attnlab compiled | compiled vs eager |" if args.compile else ""
    print(f"| precision | search | attnlab | transformers generate | ratio |{extra}\n"
          f"|---|---|---|---|---|{'---|---|' if args.compile else ''}")
    for bf16 in [p == "bf16" for p in args.precisions]:
        for beam, r in decode_speed(cfg, src, args.max_len, bf16, args.compile).items():
            line = (f"| {'bf16' if bf16 else 'fp32'} | {'greedy' if beam == 1 else 'beam 4'} | "
                    f"{r['attnlab']:.1f} | {r['transformers']:.1f} | "
                    f"{r['attnlab'] / r['transformers']:.2f}x |")
            if args.compile:
                line += (f" {r['attnlab compiled']:.1f} | "
                         f"{r['attnlab compiled'] / r['attnlab']:.2f}x |")
            print(line, flush=True)


if __name__ == "__main__":
    main()
