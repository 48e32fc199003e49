"""Character-level Tiny Shakespeare: attnlab's GPT vs Hugging Face GPT2LMHeadModel, side by side.

Same configuration (4 layers, 4 heads, d_model 128, context 64, GELU-tanh, pre-LN, tied
embeddings, dropout 0), the same initial weights (HF's initialisation, copied into attnlab
through ``from_pretrained``), the same batches (batch 12), the same AdamW (weight decay 0.1 on
matrices, learning rate 1e-3 with 100 warm-up steps and cosine decay to 1e-4, clipping 1.0).
The two models alternate step by step in one process; only the training steps are timed.
Validation: the last 10% of the text, every non-overlapping 64-character window.

    .venv/bin/python benchmarks/tinyshakespeare.py [--iters 2000] [--precision bf16] [--seed 0]

``--seed`` picks the initial weights and the batches (both models get the same ones).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers

from attnlab import from_pretrained, hardware
from attnlab.data.lm import LMBatches, eval_windows
from attnlab.tokenizers import CharTokenizer
from attnlab.training.schedule import CosineSchedule
from attnlab.training.trainer import TrainConfig, build_optimizer

DATA = Path(__file__).resolve().parents[1].parent / "shared/data/tinyshakespeare/input.txt"


def loss_of(model, x, y, hf: bool):
    logits = model(x).logits if hf else model(x)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())


@torch.no_grad()
def val_loss(model, batches, hf: bool, bf16: bool) -> float:
    model.eval()
    total = n = 0
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            total += loss_of(model, x, y, hf).item() * y.numel()
        n += y.numel()
    model.train()
    return total / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"],
                   help="autocast precision of both models (auto: attnlab.hardware's choice)")
    p.add_argument("--text", default=str(DATA))
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(hardware.report())
    args.bf16 = hardware.pick_precision(args.precision, torch.device("cpu")) == "bf16"
    text = Path(args.text).read_text()
    tok = CharTokenizer.train([text])
    ids = torch.tensor(tok.encode(text))
    split = int(0.9 * len(ids))
    train, val = ids[:split], ids[split:]
    torch.manual_seed(args.seed)
    hf_cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=128,
                                     n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=tok.eos_id,
                                     eos_token_id=tok.eos_id)
    theirs = transformers.GPT2LMHeadModel(hf_cfg)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    models = {"attnlab": ours.train(), "transformers": theirs.train()}
    cfg = TrainConfig(optimizer="adamw", weight_decay=args.weight_decay, betas=(0.9, args.beta2),
                      eps=1e-8)
    schedule = CosineSchedule(1e-3, args.warmup, args.iters, args.min_lr)
    opts = {k: build_optimizer(m, cfg, schedule(1)) for k, m in models.items()}
    batches = LMBatches(train, 64, 12, seed=args.seed)
    seconds = dict.fromkeys(models, 0.0)
    print(f"vocabulary {tok.vocab_size}, {len(train):,} train / {len(val):,} val characters, "
          f"{args.iters} iterations, {'bf16' if args.bf16 else 'fp32'}, seed {args.seed}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for step in range(1, args.iters + 1):
        x, y = batches.batch(step)
        for name, model in models.items():
            for group in opts[name].param_groups:
                group["lr"] = schedule(step)
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = loss_of(model, x, y, name == "transformers")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            seconds[name] += time.perf_counter() - start
        if step % 500 == 0:
            print(f"step {step}: " + ", ".join(
                f"{k} {12 * 64 * step / seconds[k]:,.0f} tokens/s" for k in models), flush=True)
    windows = eval_windows(val, 64, 64)
    rates = {k: 12 * 64 * args.iters / seconds[k] for k in models}
    for name, model in models.items():
        loss = val_loss(model, windows, name == "transformers", args.bf16)
        print(f"{name}: validation loss {loss:.4f}, {rates[name]:,.0f} training tokens/s")
    print(f"speed ratio attnlab / transformers: {rates['attnlab'] / rates['transformers']:.2f}x")


if __name__ == "__main__":
    main()
