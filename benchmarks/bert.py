"""Encoder forward throughput: attnlab's BERT vs transformers' BertModel, same weights.

A BertModel is built from a config (bert-base by default; `--model minilm` uses the real
all-MiniLM-L6-v2 files), saved, and loaded into attnlab, so both run identical weights on
identical batches (batch 32 × 128 tokens, ~25% of rows padded at random lengths). The two
alternate call by call in one process; the outputs are checked equal before timing.

    .venv/bin/python benchmarks/bert.py [--model bert-base|minilm] [--iters 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

from attnlab import from_pretrained, hardware


def reference_model(kind: str):
    if kind == "minilm":
        from attnlab.storage import minilm_path

        path = minilm_path()
        return transformers.BertModel.from_pretrained(path), str(path)
    torch.manual_seed(0)
    theirs = transformers.BertModel(transformers.BertConfig())
    folder = tempfile.mkdtemp(prefix="bert-bench-")
    theirs.save_pretrained(folder)
    return theirs, folder


def batch(vocab: int, n: int, length: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    for row in range(0, n, 4):  # every fourth row is padded after a random length
        cut = int(torch.randint(length // 4, length, (1,), generator=g))
        mask[row, cut:] = 0
        ids[row, cut:] = 0
    return ids, torch.zeros_like(ids), mask


def bench(kind: str, iters: int, n: int, length: int, dtype: torch.dtype) -> dict:
    theirs, folder = reference_model(kind)
    ours = from_pretrained(folder)
    theirs, ours = theirs.eval().to(dtype), ours.eval().to(dtype)
    ids, types, mask = batch(theirs.config.vocab_size, n, length)
    real = mask.bool()[..., None]

    def run_theirs():
        return theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state

    def run_ours():
        return ours.encode(ids, types, mask)

    with torch.inference_mode():
        diff = float(((run_ours().float() - run_theirs().float()) * real).abs().max())
        times = {"attnlab": 0.0, "transformers": 0.0}
        for _ in range(2):  # warm-up
            run_ours(), run_theirs()
        for _ in range(iters):
            for name, fn in (("attnlab", run_ours), ("transformers", run_theirs)):
                start = time.perf_counter()
                fn()
                times[name] += time.perf_counter() - start
    rate = {k: n * iters / v for k, v in times.items()}
    return {"ours": rate["attnlab"], "theirs": rate["transformers"],
            "ratio": rate["attnlab"] / rate["transformers"], "max_diff": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["bert-base", "minilm"], default="bert-base")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--len", type=int, default=128)
    args = p.parse_args()
    print(hardware.report())
    print(f"{args.model}: batch {args.batch} × {args.len}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| precision | attnlab sentences/s | transformers sentences/s | ratio | max diff |")
    print("|---|---|---|---|---|")
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        r = bench(args.model, args.iters, args.batch, args.len, dtype)
        print(f"| {name} | {r['ours']:.1f} | {r['theirs']:.1f} | {r['ratio']:.2f}x | "
              f"{r['max_diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
