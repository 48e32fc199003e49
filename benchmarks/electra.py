"""ELECTRA against BERT's masked-LM at the same size and step budget, then both fine-tuned on
spam.

Two pretraining runs on Tiny Shakespeare (../shared/data/tinyshakespeare), each with the same
preset (electra-small, fewer layers), the same WordPiece vocabulary size, batches, steps and
optimiser (train mlm's): ``attnlab train electra`` (the discriminator's accuracy on the
validation lines' tokens, and on those its generator replaced) and ``attnlab train mlm``. Each
encoder is then fine-tuned by the same ``attnlab train classify`` command on the spam corpus
(../shared/data/spam, subject and body, the fixed hash split); the test accuracies are
printed side by side. Every run is the command a user types, called in this process.

    .venv/bin/python benchmarks/electra.py [--steps 1000] [--layers 2] [--out runs/electra-bench]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from attnlab.cli import main as attnlab

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


class _Tee(io.StringIO):
    """What a command prints, kept and shown as it comes."""

    def write(self, s: str) -> int:
        sys.__stdout__.write(s)
        return super().write(s)


def command(*argv) -> tuple[str, float]:
    """``attnlab *argv`` in this process: its printed output and its seconds (exits on
    failure)."""
    print("$ attnlab " + " ".join(str(a) for a in argv), flush=True)
    out, start = _Tee(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = attnlab([str(a) for a in argv])
    if code:
        raise SystemExit(f"attnlab {argv[0]} {argv[1]} failed with exit code {code}")
    return out.getvalue(), time.perf_counter() - start


def test_accuracy(printed: str) -> float:
    return float(re.search(r"^test: accuracy ([0-9.]+)", printed, re.M).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", default=str(SHARED / "tinyshakespeare" / "input.txt"))
    p.add_argument("--spam", default=str(SHARED / "spam" / "emails.jsonl.gz"))
    p.add_argument("--steps", type=int, default=1000, help="pretraining steps, each run")
    p.add_argument("--layers", type=int, default=2, help="encoder layers of electra-small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-len", type=int, default=64, help="pretraining tokens a sequence")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=5e-4, help="pretraining peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="pretraining warmup steps")
    p.add_argument("--classify-steps", type=int, default=300)
    p.add_argument("--classify-lr", type=float, default=3e-4)
    p.add_argument("--out", default="runs/electra-bench")
    args = p.parse_args()
    for path in (args.text, args.spam):
        if not Path(path).exists():
            raise SystemExit(f"{path}: not here (../shared/data, see its README.md)")
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    print(f"# {platform.processor() or platform.machine()}, "
          f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    shape = ["--preset", "electra-small", "--set", f"n_encoder_layers={args.layers}"]
    common = [*shape, "--text", args.text, "--vocab-size", args.vocab_size, "--steps",
              args.steps, "--batch", args.batch, "--max-len", args.max_len, "--lr", args.lr,
              "--warmup", args.warmup, "--eval-every",
              args.steps, "--save-every", args.steps, "--no-progress", "--seed", "0"]
    electra, t_electra = command("train", "electra", *common, "--out", out / "electra")
    mlm, t_mlm = command("train", "mlm", *common, "--out", out / "mlm")
    scores = re.search(r"accuracy ([0-9.]+); on the ([0-9.]+)% replaced ([0-9.]+), on the "
                       r"originals ([0-9.]+); ranking AUC ([0-9.]+)", electra).groups()
    tuned = {}
    for name in ("electra", "mlm"):
        printed, seconds = command(
            "train", "classify", "--data", args.spam, "--text-field", "subject,body",
            "--label-field", "label", "--init", out / name, "--steps", args.classify_steps,
            "--lr", args.classify_lr, "--warmup", args.classify_steps // 10, "--batch", 32,
            "--max-len", 128, "--eval-every", 50, "--no-progress", "--seed", "0", "--out",
            out / f"{name}-spam")
        tuned[name] = (test_accuracy(printed), seconds)
    print(f"\npretraining, {args.steps} steps of {args.batch} x {args.max_len} tokens, "
          f"electra-small with {args.layers} layers:")
    print(f"  ELECTRA discriminator: accuracy {scores[0]} on all validation tokens; "
          f"{scores[2]} on the {scores[1]}% its generator replaced, {scores[3]} on the "
          f"originals; ranking AUC {scores[4]} ({t_electra:.0f} s)")
    print(f"  BERT masked-LM ({t_mlm:.0f} s)")
    print(f"spam, {args.classify_steps} fine-tuning steps each:")
    for name, label in (("electra", "from the ELECTRA discriminator"),
                        ("mlm", "from the BERT masked-LM")):
        print(f"  {label}: test accuracy {tuned[name][0]:.4f} ({tuned[name][1]:.0f} s)")


if __name__ == "__main__":
    main()
