"""Multi30k German→English with the paper's recipe, on this machine, in a fixed time budget.

1. a shared byte-level BPE vocabulary learned from train.de + train.en;
2. an encoder–decoder trained with Adam (0.9, 0.98, 1e-9), the warmup + inverse-square-root
   schedule, label smoothing 0.1, dropout 0.1, bf16 autocast, for ``--minutes`` of wall time;
3. the last ``--average`` checkpoints averaged (the paper averaged the last 5);
4. test_2016_flickr decoded with beam 4, α = 0.6, and scored with detokenised, cased
   sacreBLEU (the signature is printed).

    .venv/bin/python benchmarks/multi30k.py --minutes 30 --out runs/multi30k
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

from attnlab import ModelConfig, hardware
from attnlab.data import Corpus, read_lines
from attnlab.generation import translate
from attnlab.storage import load_model_dir
from attnlab.tokenizers import BPETokenizer
from attnlab.training.checkpoint import write_average
from attnlab.training.recipes import train_translation
from attnlab.training.schedule import NoamSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--minutes", type=float, default=30.0, help="training wall-time budget")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--preset", default="small")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=3000, help="per side per batch")
    p.add_argument("--warmup", type=int, default=600)
    p.add_argument("--lr-factor", type=float, default=0.6)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--average", type=int, default=5)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--limit", type=int, help="score only the first N test sentences")
    p.add_argument("--precision", default="auto", choices=hardware.PRECISIONS,
                   help="auto: what attnlab.hardware picks for this machine")
    p.add_argument("--out", default="runs/multi30k")
    args = p.parse_args()
    print(hardware.report())
    data = Path(args.data)
    if not data.exists():
        raise SystemExit(f"Multi30k not found at {data}")

    de, en = read_lines(data / "train.de.gz"), read_lines(data / "train.en.gz")
    start = time.perf_counter()
    tok = BPETokenizer.train(de + en, args.vocab)
    print(f"BPE: {tok.vocab_size} shared tokens learned in {time.perf_counter() - start:.1f} s")
    config = ModelConfig.from_preset(
        args.preset, d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff,
        n_encoder_layers=args.layers, n_decoder_layers=args.layers, dropout=args.dropout,
        max_len=256)
    train_config = TrainConfig(
        steps=10**6, max_tokens=args.max_tokens, precision=args.precision,
        label_smoothing=0.1,
        schedule=schedule_to_dict(NoamSchedule(args.d_model, args.warmup, args.lr_factor)),
        save_every=args.save_every, keep_last=args.average, time_budget=args.minutes * 60,
        progress=False, log_every=100)
    start = time.perf_counter()
    _, toks, history = train_translation(Corpus(list(zip(de, en, strict=True)), []), args.out,
                                         config, train_config, shared_tokenizer=tok)
    train_seconds = time.perf_counter() - start
    last = history[-1]
    folder, used = write_average(args.out, args.average)
    model = load_model_dir(folder)[0]

    src = read_lines(data / "test_2016_flickr.de.gz")
    ref = read_lines(data / "test_2016_flickr.en.gz")
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    start = time.perf_counter()
    hyps = translate(model, toks["source"], toks["target"], src, batch_size=64,
                     beam_size=args.beam, alpha=args.alpha)
    decode_seconds = time.perf_counter() - start
    bleu_metric, chrf_metric = BLEU(), CHRF()
    bleu = bleu_metric.corpus_score(hyps, [ref])
    chrf = chrf_metric.corpus_score(hyps, [ref])
    Path(args.out, "test_2016_flickr.hyp.en").write_text("\n".join(hyps) + "\n")
    result = {
        "bleu": round(bleu.score, 2), "signature": str(bleu_metric.get_signature()),
        "chrf": round(chrf.score, 2), "train_minutes": round(train_seconds / 60, 1),
        "steps": last["step"], "tokens_per_s": round(last["tokens_per_s"]),
        "averaged": [c.name for c in used], "decode_seconds": round(decode_seconds, 1),
        "model": {k: getattr(config, k) for k in ("d_model", "n_heads", "d_ff",
                                                    "n_encoder_layers", "dropout")},
    }
    Path(args.out, "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
