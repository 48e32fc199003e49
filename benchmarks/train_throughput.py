"""Training tokens/s: attnlab's encoder–decoder vs torch.nn.Transformer, side by side.

Same dimensions (the `small` preset unless overridden), the same scaled embeddings, sinusoidal
positions, tied output projection, the same batches, masks, loss and Adam settings; the two
models alternate step by step in one process so machine noise hits both alike.

    .venv/bin/python benchmarks/train_throughput.py [--steps 30] [--batch 64] [--len 32]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from attnlab import ModelConfig, Transformer, hardware
from attnlab.nn import sinusoidal_table
from attnlab.training.loss import label_smoothed_loss


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with the paper's embeddings around it (the peer)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.register_buffer("pe", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers,
                                   cfg.n_decoder_layers, cfg.d_ff, cfg.dropout, batch_first=True)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, src, tgt):
        scale = math.sqrt(self.cfg.d_model)
        s = self.embed(src) * scale + self.pe[: src.shape[1]]
        t = self.embed(tgt) * scale + self.pe[: tgt.shape[1]]
        causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).triu(1)
        pad = src == self.cfg.pad_id
        h = self.core(s, t, tgt_mask=causal, src_key_padding_mask=pad,
                      memory_key_padding_mask=pad, tgt_is_causal=True)
        return self.out(h)


def make_batches(cfg, n, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lens = torch.randint(length // 2, length + 1, (batch,), generator=g)
        src = torch.randint(4, cfg.vocab_size, (batch, length), generator=g)
        tgt = torch.randint(4, cfg.vocab_size, (batch, length + 1), generator=g)
        mask = torch.arange(length)[None] >= lens[:, None]
        src[mask] = 0
        tgt[:, 1:][mask] = 0
        out.append((src, tgt))
    return out


def step(model, opt, src, tgt, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(src, tgt[:, :-1])
    sums = label_smoothed_loss(logits, tgt[:, 1:])
    (sums.loss / sums.tokens).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return int((src != 0).sum()) + sums.tokens


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--len", type=int, default=32)
    args = p.parse_args()
    print(hardware.report())
    cfg = ModelConfig.from_preset(args.preset, dropout=0.1)
    batches = make_batches(cfg, args.steps + args.warmup, args.batch, args.len)
    print(f"preset {args.preset}: d_model {cfg.d_model}, {cfg.n_encoder_layers}+"
          f"{cfg.n_decoder_layers} layers, vocab {cfg.vocab_size}; batch {args.batch} x "
          f"{args.len}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for bf16 in (False, True):
        torch.manual_seed(0)
        models = {"attnlab": Transformer(cfg), "torch.nn.Transformer": TorchTransformer(cfg)}
        opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
                for k, m in models.items()}
        seconds = dict.fromkeys(models, 0.0)
        tokens = dict.fromkeys(models, 0)
        for i, (src, tgt) in enumerate(batches):
            for name, model in models.items():  # alternate: noise hits both alike
                t0 = time.perf_counter()
                n = step(model, opts[name], src, tgt, bf16)
                if i >= args.warmup:
                    seconds[name] += time.perf_counter() - t0
                    tokens[name] += n
        rates = {k: tokens[k] / seconds[k] for k in models}
        ratio = rates["attnlab"] / rates["torch.nn.Transformer"]
        print(f"{'bf16' if bf16 else 'fp32'}: " + ", ".join(
            f"{k} {v:,.0f} tokens/s" for k, v in rates.items()) + f"; ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
