"""Multi30k German→English with the paper's recipe, on this machine, in a fixed time budget.

It runs the README's Multi30k commands, exactly (``tests/test_readme.py`` checks that the README
shows these lines), in a folder where ``multi30k/`` is the data:

1. ``attnlab tokenize train``: one shared byte-level BPE vocabulary from train.de + train.en;
2. ``attnlab train translate``: an encoder–decoder (the ``small`` preset) trained with Adam
   (0.9, 0.98, 1e-9), the warmup + inverse-square-root schedule, label smoothing 0.1 and
   dropout 0.1, in the precision ``auto`` picks, for 30 minutes of wall time, on all 29,000
   pairs; the last 5 checkpoints averaged (the paper averaged the last 5);
3. ``attnlab evaluate translate``: test_2016_flickr decoded with beam 4, α = 0.6, scored with
   detokenised, cased sacreBLEU (the signature is printed), chrF and ROUGE.

    .venv/bin/python benchmarks/multi30k.py --out runs/multi30k
    .venv/bin/python benchmarks/multi30k.py --minutes 10 --out runs/multi30k-10

``--minutes`` replaces the commands' ``--time-budget 1800``; nothing else differs from the
README.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from attnlab import hardware

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
COMMANDS = [
    "attnlab tokenize train --vocab-size 8000 multi30k/train.de.gz multi30k/train.en.gz "
    "--out runs/bpe.json",
    "attnlab train translate --src multi30k/train.de.gz --tgt multi30k/train.en.gz "
    "--tokenizer runs/bpe.json --preset small --set max_len=256 --max-tokens 3000 --warmup 600 "
    "--lr-factor 0.6 --save-every 100 --keep-last 5 --average-last 5 --steps 100000 "
    "--time-budget 1800 --out runs/m30k",
    "attnlab evaluate translate --model runs/m30k --src multi30k/test_2016_flickr.de.gz "
    "--ref multi30k/test_2016_flickr.en.gz --beam 4 --alpha 0.6 --out runs/test.hyp.en",
]


def run(command: str, folder: Path, minutes: float) -> str:
    """Run one README command in ``folder`` (its output shown as it comes); its stdout."""
    argv = shlex.split(command.replace("--time-budget 1800", f"--time-budget {minutes * 60:g}"))
    print(f"$ {shlex.join(argv)}", flush=True)
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", *argv[1:]], cwd=folder,
                          stdout=subprocess.PIPE, text=True)  # the progress bar on stderr
    print(done.stdout, end="", flush=True)
    if done.returncode:
        raise SystemExit(f"exit code {done.returncode}: {command}")
    return done.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA), help="folder of the Multi30k task 1 raw files")
    p.add_argument("--minutes", type=float, default=30.0, help="training wall-time budget")
    p.add_argument("--out", default="runs/multi30k", help="working folder (runs/m30k in it)")
    args = p.parse_args()
    print(hardware.report())
    data = Path(args.data).resolve()
    if not data.exists():
        raise SystemExit(f"Multi30k not found at {data}")
    folder = Path(args.out)
    (folder / "runs").mkdir(parents=True, exist_ok=True)  # (tokenize writes a file in it)
    link = folder / "multi30k"
    if not link.exists():
        os.symlink(data, link)
    outputs = [run(command, folder, args.minutes) for command in COMMANDS]
    rows = [json.loads(line) for line in (folder / "runs/m30k/metrics.jsonl").open()]
    last = [r for r in rows if "tokens_per_s" in r][-1]
    result = {
        "bleu": float(re.search(r"BLEU = ([\d.]+)", outputs[2]).group(1)),
        "chrf": float(re.search(r"chrF = ([\d.]+)", outputs[2]).group(1)),
        "signature": re.search(r"signature: (\S+)", outputs[2]).group(1),
        "steps": rows[-1]["step"], "tokens_per_s": round(last["tokens_per_s"]),
        "minutes": args.minutes, "decoding": re.search(r"decoding: (.*)", outputs[2]).group(1),
    }
    (folder / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
