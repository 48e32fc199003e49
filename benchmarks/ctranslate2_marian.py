"""Beam-4 translation: attnlab (eager and compiled) against CTranslate2 on the same Marian
weights, each engine in its own process (two OpenMP runtimes in one process slow each other).

The model is benchmarks/translation.py's: the ``small`` preset in Marian's shape (d_model 256,
3 + 3 layers, 8,000 tokens), random weights, written as a transformers MarianMTModel folder by
``save_pretrained``, which CTranslate2's converter reads. Two things in that converter do not
fit attnlab's folder, and the script works around both:

* it builds the vocabulary from the folder's tokenizer (``AutoTokenizer``), and attnlab writes
  no SentencePiece files: the converter gets a stand-in tokenizer naming token ``i`` ``t<i>``;
* its Marian loader takes the last id for transformers' added ``<pad>`` and drops that row,
  while attnlab's Marian shape has pad at 0: the stand-in calls the last id ``<pad>``, and the
  sources never use it.

The decoder starts differently (CTranslate2 from a zero embedding, attnlab from its pad/bos
row), so the tokens are not compared; the work is: beam 4, GNMT length penalty 0.6, exactly
``--max-len`` − 1 new tokens per sentence (a minimum and a maximum, so random weights never
stop early), fp32, the same sources.

    .venv/bin/python benchmarks/ctranslate2_marian.py [--sentences 1 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnlab import ModelConfig, Transformer, hardware, save_pretrained


def config() -> ModelConfig:
    return ModelConfig.from_preset("small", dropout=0.0, positional="sinusoidal-split",
                                   output_bias=True, bos_id=0)


def sources(cfg: ModelConfig, n: int) -> torch.Tensor:
    """``n`` sentences of 10–20 tokens, ids 4 .. vocab − 2, padded with 0."""
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(10, 21, (n,), generator=g)
    src = torch.randint(4, cfg.vocab_size - 1, (n, 20), generator=g)
    src[torch.arange(20)[None] >= lens[:, None]] = 0
    return src


class _StandIn:
    """What the converter reads from a tokenizer: the vocabulary and two special tokens."""

    def __init__(self, cfg: ModelConfig):
        names = [f"t{i}" for i in range(cfg.vocab_size)]
        names[cfg.eos_id], names[cfg.unk_id], names[-1] = "</s>", "<unk>", "<pad>"
        self.vocab = {name: i for i, name in enumerate(names)}
        self.eos_token, self.unk_token = "</s>", "<unk>"

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def convert(folder: Path, cfg: ModelConfig) -> Path:
    import ctranslate2

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, *args, **kwargs):
            return _StandIn(cfg)

    out = folder / "ct2"
    Converter(str(folder / "hf")).convert(str(out), force=True)
    return out


def best_of(fn, repeats: int = 2) -> float:
    fn()  # warm-up (and the compile)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def attnlab_worker(folder: str, n: int, max_len: int, threads: int) -> dict:
    from attnlab.generation import beam_search
    from attnlab.generation.compiled import CompiledStep, encoder_decoder_token

    torch.set_num_threads(threads)
    cfg = config()
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    model.load_state_dict(torch.load(Path(folder) / "weights.pt", weights_only=True))
    src = sources(cfg, n)
    step = CompiledStep(function=encoder_decoder_token)
    out = {}
    with torch.no_grad():
        out["attnlab eager"] = best_of(lambda: beam_search(model, src, 4, 0.6, max_len=max_len))
        begun = time.perf_counter()
        beam_search(model, src, 4, 0.6, max_len=max_len, compiled=step)
        out["compile_s"] = time.perf_counter() - begun
        out["attnlab compiled"] = best_of(
            lambda: beam_search(model, src, 4, 0.6, max_len=max_len, compiled=step))
    return out


def ctranslate2_worker(folder: str, n: int, max_len: int, threads: int) -> dict:
    import ctranslate2

    cfg = config()
    translator = ctranslate2.Translator(str(Path(folder) / "ct2"), device="cpu",
                                       inter_threads=1, intra_threads=threads,
                                       compute_type="float32")
    tokens = [[f"t{i}" for i in row if i != 0] for row in sources(cfg, n).tolist()]
    new = max_len - 1  # attnlab's max_len counts the start token

    def run():
        return translator.translate_batch(tokens, beam_size=4, length_penalty=0.6,
                                          max_decoding_length=new, min_decoding_length=new,
                                          max_batch_size=n)

    results = run()
    lengths = {len(r.hypotheses[0]) for r in results}
    return {"ctranslate2": best_of(run), "ct2_lengths": sorted(lengths),
            "version": ctranslate2.__version__}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sentences", nargs="+", type=int, default=[1, 64])
    p.add_argument("--max-len", type=int, default=40, help="decoded length (with the start)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)  # engine, folder, sentences
    args = p.parse_args()
    if args.worker:
        engine, folder, n = args.worker
        work = attnlab_worker if engine == "attnlab" else ctranslate2_worker
        print(json.dumps(work(folder, int(n), args.max_len, args.threads)))
        return
    print(hardware.report())
    cfg = config()
    folder = Path(tempfile.mkdtemp(prefix="ct2-bench-"))
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    torch.save(model.state_dict(), folder / "weights.pt")
    save_pretrained(model, folder / "hf")
    convert(folder, cfg)
    print(f"beam 4, length penalty 0.6, {args.max_len - 1} new tokens a sentence, fp32, "
          f"{args.threads} threads, each engine in its own process")
    print("| sentences | attnlab eager | attnlab compiled | CTranslate2 | compiled vs "
          "CTranslate2 |\n|---|---|---|---|---|")
    for n in args.sentences:
        got = {}
        for engine in ("attnlab", "ctranslate2"):
            line = subprocess.run(
                [sys.executable, __file__, "--worker", engine, str(folder), str(n),
                 "--max-len", str(args.max_len), "--threads", str(args.threads)],
                check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            got.update(json.loads(line))
        rate = {k: n / v for k, v in got.items()
                if k in ("attnlab eager", "attnlab compiled", "ctranslate2")}
        print(f"| {n} | {rate['attnlab eager']:.2f} | {rate['attnlab compiled']:.2f} | "
              f"{rate['ctranslate2']:.2f} | {rate['attnlab compiled'] / rate['ctranslate2']:.2f}x |"
              f"  (sentences/s; compile {got['compile_s']:.1f} s; CTranslate2 "
              f"{got['version']}, hypothesis lengths {got['ct2_lengths']})", flush=True)


if __name__ == "__main__":
    main()
