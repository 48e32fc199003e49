"""Zero- and few-shot scoring of SmolLM2-135M on two real tasks, and lm-evaluation-harness
beside it on the same files.

Two multiple-choice tasks are built from the data in ``../shared/data``:

* **entity type** (4-way), from the CoNLL-2003 test set: "In '<sentence>', the words '<X>'
  name a:" with the choices person / location / organisation / other (CoNLL's MISC), one
  question per entity, as many of each type; the demonstrations come from the development set;
* **spam** (2-way), from the SpamAssassin corpus: the subject and the first 200 characters of
  an email, "Is this email spam?" with the choices no / yes; the demonstrations come from
  emails not in the test set.

``attnlab evaluate choice`` scores each with k = 0, 1 and 5 demonstrations drawn with a fixed
seed from the pool, so the course's claim that few-shot accuracy grows with k is measured.

Then the parity and speed check against lm-evaluation-harness (``--lm-eval-python``, the
interpreter of an environment where ``lm_eval`` is installed, see benchmarks/lm_eval_choice.py):
SmolLM2 in float32 as a Hugging Face folder (made once from the packaged GGUF file), k = 0
and k = 5 with the first five pool lines as demonstrations (``--pool-order file``) on both
sides; the two must make the same decision on every example, and the time of the scoring
alone (model load excluded) is compared at the same batch size.

    .venv/bin/python benchmarks/fewshot.py --out runs/fewshot \\
        --lm-eval-python /tmp/lmeval/bin/python
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shlex
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TYPES = {"PER": "person", "LOC": "location", "ORG": "organisation", "MISC": "other"}
ENTITY_CHOICES = ["person", "location", "organisation", "other"]
SPAM_CHOICES = ["no", "yes"]


def _line(context: str, choices: list[str], answer: int, instruction: str | None = None) -> str:
    row = {"context": context, "choices": choices, "answer": answer}
    if instruction:
        row["instruction"] = instruction
    return json.dumps(row, ensure_ascii=False) + "\n"


def entity_questions(path: Path, per_type: int, seed: int) -> list[str]:
    """``per_type`` questions for each CoNLL entity type, drawn with ``seed``."""
    from attnlab.tasks.ner import entities, read_conll

    by_type: dict[str, list[str]] = {kind: [] for kind in TYPES}
    for sentence in read_conll(path):
        text = " ".join(sentence.words)
        for kind, start, end in entities(sentence.tags):
            words = " ".join(sentence.words[start:end])
            context = f"In '{text}', the words '{words}' name a:"
            by_type[kind].append(_line(context, ENTITY_CHOICES,
                                       ENTITY_CHOICES.index(TYPES[kind])))
    rng = random.Random(seed)
    lines = [q for kind in TYPES for q in rng.sample(by_type[kind], per_type)]
    rng.shuffle(lines)
    return lines


def spam_questions(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        body = " ".join(row["body"].split())[:200]
        context = f"Subject: {row['subject']}\n{body}\nIs this email spam?"
        lines.append(_line(context, SPAM_CHOICES, int(row["label"] == "spam")))
    return lines


def build_tasks(out: Path, n: int, seed: int) -> dict[str, tuple[Path, Path]]:
    """Write each task's test file and demonstration pool; ``{name: (data, pool)}``."""
    out.mkdir(parents=True, exist_ok=True)
    conll = DATA / "conll2003"
    tasks = {"entity type": (entity_questions(conll / "test.txt", n // 4, seed),
                             entity_questions(conll / "dev.txt", 25, seed))}
    with gzip.open(DATA / "spam" / "emails.jsonl.gz", "rt", encoding="utf-8") as f:
        emails = [json.loads(line) for line in f]
    rng = random.Random(seed)
    by_label = {label: [e for e in emails if e["label"] == label] for label in ("ham", "spam")}
    test, pool = [], []
    for rows in by_label.values():  # as many spam as ham in both, none in both
        chosen = rng.sample(rows, n // 2 + 25)
        test += chosen[: n // 2]
        pool += chosen[n // 2:]
    rng.shuffle(test)
    rng.shuffle(pool)
    tasks["spam"] = (spam_questions(test), spam_questions(pool))
    files = {}
    for name, (questions, demos) in tasks.items():
        stem = name.replace(" ", "-")
        data, pool_file = out / f"{stem}.jsonl", out / f"{stem}-pool.jsonl"
        data.write_text("".join(questions), encoding="utf-8")
        pool_file.write_text("".join(demos), encoding="utf-8")
        files[name] = (data, pool_file)
    return files


def attnlab_choice(model: str, data: Path, pool: Path, shots: int, extra: list[str]) -> dict:
    """``attnlab evaluate choice`` in a fresh process; its ``--json`` summary."""
    argv = [sys.executable, "-m", "attnlab.cli", "evaluate", "choice", "--model", model,
            "--data", str(data), "--pool", str(pool), "--shots", str(shots), "--json", *extra]
    print("$ " + shlex.join(["attnlab", *argv[3:]]), flush=True)
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def lm_eval_choice(python: str, model: Path, data: Path, pool: Path, shots: int,
                   batch: int, precision: str) -> dict:
    script = Path(__file__).with_name("lm_eval_choice.py")
    argv = [python, str(script), "--model", str(model), "--data", str(data), "--pool",
            str(pool), "--shots", str(shots), "--batch", str(batch),
            "--dtype", {"fp32": "float32", "bf16": "bfloat16"}[precision]]
    print("$ " + shlex.join(argv), flush=True)
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def smollm2_hf_folder(out: Path) -> Path:
    """SmolLM2-135M as a float32 Hugging Face folder, made once by transformers from the
    packaged GGUF file (its tokenizer too), so both sides read the same files."""
    folder = out / "smollm2-hf"
    if (folder / "model.safetensors").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    from attnlab.storage import smollm2_path

    gguf = smollm2_path()
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):  # the weights are dequantised float32 now
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/fewshot", help="folder for the task files and models")
    p.add_argument("--n", type=int, default=200, help="test questions per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2", help="the model of the k = 0, 1, 5 table")
    p.add_argument("--lm-eval-python", help="an interpreter with lm_eval: run the comparison")
    p.add_argument("--batch", type=int, default=4,
                   help="batch size of the comparison, the same number on both sides: "
                        "attnlab's --batch counts questions (all their choices), lm-eval's "
                        "--batch_size requests (it merges a question's one-token choices into "
                        "one row)")
    p.add_argument("--skip-table", action="store_true", help="only the lm-eval comparison")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="of the comparison, both sides (lm-eval: its dtype)")
    args = p.parse_args()
    from attnlab import hardware

    print(hardware.report(), flush=True)
    out = Path(args.out)
    files = build_tasks(out, args.n, args.seed)
    table = {}
    for name, (data, pool) in files.items():
        for k in () if args.skip_table else (0, 1, 5):
            result = attnlab_choice(args.model, data, pool, k, ["--seed", str(args.seed)])
            table[name, k] = result
            print(f"{name}, k={k}: acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f}",
                  flush=True)
    if table:
        print("\n| task | k | acc ± stderr | acc_norm ± stderr |\n|---|---|---|---|")
    for (name, k), r in table.items():
        print(f"| {name} | {k} | {r['acc']:.3f} ± {r['acc_stderr']:.3f} | "
              f"{r['acc_norm']:.3f} ± {r['acc_norm_stderr']:.3f} |")
    if not args.lm_eval_python:
        return
    folder = smollm2_hf_folder(out)
    print(f"\nbatch size {args.batch} and {args.precision} on both sides, model load excluded")
    print("\n| task | k | attnlab acc / acc_norm | lm-eval acc / acc_norm | same decisions "
          "| largest log-likelihood difference | attnlab s | lm-eval s | speed-up |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for name, (data, pool) in files.items():
        for k in (0, 5):
            ours = attnlab_choice(str(folder), data, pool, k,
                                  ["--pool-order", "file", "--precision", args.precision,
                                   "--batch", str(args.batch)])
            theirs = lm_eval_choice(args.lm_eval_python, folder, data, pool, k, args.batch,
                                    args.precision)
            same = sum(a == b for a, b in zip(ours["decisions"], _decisions(theirs), strict=True))
            same_norm = sum(a == b for a, b in zip(ours["decisions_norm"],
                                                  _decisions(theirs, ours["lengths"]), strict=True))
            print(f"| {name} | {k} | {ours['acc']:.4f} / {ours['acc_norm']:.4f} | "
                  f"{theirs['acc']:.4f} / {theirs['acc_norm']:.4f} | "
                  f"{same}/{len(ours['decisions'])} acc, {same_norm} acc_norm | "
                  f"{_largest_difference(ours, theirs):.1e} | "
                  f"{ours['seconds']:.1f} | {theirs['seconds']:.1f} | "
                  f"{theirs['seconds'] / ours['seconds']:.2f}x |", flush=True)


def _largest_difference(ours: dict, theirs: dict) -> float:
    return max(abs(a - b) for xs, ys in zip(ours["loglikelihoods"], theirs["loglikelihoods"],
                                            strict=True)
               for a, b in zip(xs, ys, strict=True))


def _decisions(result: dict, lengths: list[list[int]] | None = None) -> list[int]:
    """The chosen index of each example (by log-likelihood, or per character)."""
    chosen = []
    for i, scores in enumerate(result["loglikelihoods"]):
        if lengths is not None:
            scores = [s / n for s, n in zip(scores, lengths[i], strict=True)]
        chosen.append(max(range(len(scores)), key=scores.__getitem__))
    return chosen


if __name__ == "__main__":
    main()
