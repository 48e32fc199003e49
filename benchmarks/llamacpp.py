"""attnlab against llama.cpp (llama-cpp-python) on the same GGUF files, each engine in its own
process, with the same threads (#25 item 4; #21's "attnlab vs llama.cpp").

For each file (SmolLM2-135M-Instruct: the packaged Q4_1 file, and f32, f16 and q8_0 files that
``attnlab export gguf`` writes from it), each engine (attnlab runs Q4_1 on the file's 4-bit
codes, ``--int4``, and Q8_0 on 8-bit codes re-quantised per channel, ``--int8``):

* prefill: one forward pass over a ``--prefill``-token prompt (tokens/s);
* decode: batch 1, greedy, ``--new-tokens`` tokens after a short prompt, never stopping at the
  end token (tokens/s over the tokens after the first, as llama.cpp counts them);
* the greedy tokens themselves, compared between the engines (how many agree from the start).

Beside each decoding figure: the bytes that engine reads per token (its weights as it holds
them, plus the KV cache at the run's mean length) and the limit that this machine's measured
matrix-vector bandwidth puts on it (bandwidth / bytes).

llama-cpp-python builds from source; it is not a dependency of attnlab's tests (the
``llamacpp`` extra). Built with ``GGML_NATIVE=ON`` it crashed on an AMX machine in batched
prompt processing; build it as docs/benchmarks.md says (``GGML_NATIVE=OFF`` and the AVX-512
flags).

    .venv/bin/python benchmarks/llamacpp.py [--types q4_1 q8_0 f16 f32] [--threads 2]
        [--engines attnlab attnlab-compiled attnlab-compiled-bf16 llamacpp]
        [--new-tokens 256] [--prefill 512] [--rounds 1] [--llamacpp-path DIR]

``--rounds N`` runs the engines N times each, taking turns, and reports each engine's median
and the median of the rounds' ratios: a VM's speed drifts over minutes, so engines timed one
after the other once can land in different phases. ``--llamacpp-path`` runs another build of
llama-cpp-python (one installed with ``pip install --target DIR``, e.g. with other ISA flags);
the line llama.cpp prints about its build is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "<|im_start|>user\nTell me about the history of Paris.<|im_end|>\n<|im_start|>assistant\n"
FILLER = ("The city grew on the banks of the river, where merchants met and traded goods from "
          "every part of the kingdom. Over the centuries it became a centre of learning, art "
          "and government, and its streets filled with scholars, painters and officials. ")


# --- workers (each in its own process) -------------------------------------------------------
def attnlab_worker(path: str, kind: str, threads: int, new: int, prefill: int,
                   compile: bool = False, bf16: bool = False) -> dict:
    """``compile``: decode through the compiled one-token step (``generate --compile``); its
    compile happens in the warm-up, outside the timed run, and is reported. ``bf16``: a float
    file's weights in bfloat16 (``--precision bf16``: half of fp32's bytes)."""
    import torch

    import attnlab
    from attnlab.cpu import for_decoding
    from attnlab.generation.compiled import CompiledStep
    from attnlab.generation.decode import generate
    from attnlab.hardware import DTYPES
    from attnlab.nn.quantized import float_dtype

    torch.set_num_threads(threads)
    # the integer files run on integer codes: Q4_1's own, Q8_0's re-quantised per channel
    int4, int8 = kind == "q4_1", kind == "q8_0"
    loaded = attnlab.load(path, int4=int4, int8=int8)
    precision = "bf16" if int4 or int8 or bf16 else "fp32"
    model = for_decoding(loaded.model, "cpu", precision, int4 or int8)
    tok = loaded.tokenizer
    prompt = torch.tensor([tok.encode(PROMPT)])
    long = torch.tensor([(tok.encode(FILLER * 64))[:prefill]])
    compiled = CompiledStep() if compile else None
    with torch.no_grad():  # (generate's own mode: a compiled graph is specialised to it)
        generate(model, prompt, new, compiled=compiled)  # warm-up: allocations, the compile
        begun = time.perf_counter()
        model(long, cache=model.new_cache(prefill))
        prefill_s = time.perf_counter() - begun
        ticks = []
        out = generate(model, prompt, new, on_token=lambda _: ticks.append(time.perf_counter()),
                       compiled=compiled)
    weights = _bytes_read(model)
    kv_dtype = _cache_dtype(model, prompt)
    return dict(prompt=prompt[0].tolist(), ids=out[0, prompt.shape[1]:].tolist(),
                prefill_tps=prefill / prefill_s, decode_tps=(new - 1) / (ticks[-1] - ticks[0]),
                weight_bytes=weights, kv_bytes=_kv_bytes(model.config, kv_dtype.itemsize),
                precision=("int4 codes" if int4 else "int8 per channel" if int8 else precision)
                + f", {str(float_dtype() if int4 or int8 else DTYPES[precision])[6:]} matrices"
                + f", {str(kv_dtype)[6:]} activations and KV cache"
                + (", int8 head" if int4 or int8 else "")
                + (f", compiled ({compiled.compile_seconds:.0f} s)" if compile else ""))


def _cache_dtype(model, prompt):
    """The dtype of the KV cache that ``model`` fills (float32 on the CPU kernel, whatever
    the matrices' precision: ``float32_activations_``)."""
    import torch

    cache = model.new_cache(4)
    with torch.no_grad():
        model(prompt[:, :1], cache=cache)
    return cache[0].k.dtype


def llamacpp_worker(path: str, kind: str, threads: int, new: int, prefill: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=max(prefill, 64 + new) + 16, n_threads=threads,
                n_threads_batch=threads, n_batch=prefill, verbose=False)
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    long = llm.tokenize((FILLER * 64).encode(), add_bos=False, special=True)[:prefill]
    llm.eval(prompt[:4])  # warm-up
    llm.reset()
    begun = time.perf_counter()
    llm.eval(long)
    prefill_s = time.perf_counter() - begun
    llm.reset()
    llm.eval(prompt)
    ids, ticks = [], []
    vocab = llm.n_vocab()
    for _ in range(new):
        # the last position's logits as llama.cpp left them (llm.scores is filled only with
        # logits_all=True in llama-cpp-python 0.3, which would copy every position's)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
        token = int(np.argmax(logits))
        ids.append(token)
        ticks.append(time.perf_counter())
        llm.eval([token])
    from gguf import GGUFReader

    reader = GGUFReader(path)
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    import llama_cpp

    return dict(prompt=list(prompt), ids=ids, prefill_tps=prefill / prefill_s,
                decode_tps=(new - 1) / (ticks[-1] - ticks[0]), weight_bytes=weights,
                kv_bytes=_kv_bytes_gguf(reader, 2), precision=kind,
                build=llama_cpp.llama_print_system_info().decode().strip())


def _bytes_read(model) -> int:
    """The weight bytes one decoded token reads: each integer layer's codes and the scales its
    kernel reads (not the copies kept for saving or for PyTorch's fallback kernels), every
    float tensor but an embedding that only looks rows up (an output layer tied to it reads
    it all, and then it is counted through that layer)."""
    from torch import nn

    from attnlab.nn.embeddings import TokenEmbedding
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    read = {Int4Linear: ("qweight", "kernel_scales", "kernel_offsets", "bias"),
            Int8Linear: ("qweight", "scales", "bias")}
    head = getattr(model, "lm_head", None)
    tied = {id(head.weight)} if isinstance(head, nn.Linear) else set()
    seen, total = set(), 0
    for module in model.modules():
        kind = next((k for k in read if isinstance(module, k)), None)  # (or its kernel subclass)
        if kind is not None:
            tensors = [getattr(module, n) for n in read[kind]]
        elif isinstance(module, (nn.Embedding, TokenEmbedding)) and id(module.weight) not in tied:
            tensors = []
        elif not list(module.children()):
            tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        else:
            continue
        for t in tensors:
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _kv_bytes(config, itemsize: int) -> int:
    """Keys and values of one token, every layer."""
    return 2 * config.n_decoder_layers * config.kv_heads * config.d_k * itemsize


def _kv_bytes_gguf(reader, itemsize: int) -> int:
    def field(key):
        f = reader.fields[key]
        return int(f.parts[f.data[0]][0])

    layers, heads = field("llama.block_count"), field("llama.attention.head_count")
    kv_heads, d = field("llama.attention.head_count_kv"), field("llama.embedding_length")
    return 2 * layers * kv_heads * (d // heads) * itemsize


def _median(engine: str, rounds: list[dict]) -> dict | None:
    """The round whose decoding speed is the median of ``engine``'s (the lower middle one of
    an even count), or None where it never ran."""
    runs = sorted((x[engine] for x in rounds if x.get(engine)), key=lambda r: r["decode_tps"])
    return runs[(len(runs) - 1) // 2] if runs else None


def _round_ratios(results: dict) -> str:
    theirs = results.get("llamacpp")
    return "".join(f"; {e} / llama.cpp {x['decode_tps'] / theirs['decode_tps']:.2f}x"
                   for e, x in results.items() if x and theirs and e != "llamacpp")


# --- the driver ------------------------------------------------------------------------------
def bandwidth() -> float:
    """GB/s that a float32 matrix-vector product reads here (a 512 MB matrix, best of 5)."""
    import torch

    m, v = torch.randn(8192, 16384), torch.randn(16384)
    best = float("inf")
    for _ in range(6):
        begun = time.perf_counter()
        torch.mv(m, v)
        best = min(best, time.perf_counter() - begun)
    return m.numel() * 4 / best / 1e9


def files(types: list[str], folder: Path) -> dict[str, Path]:
    from attnlab.storage import smollm2_path

    found = {}
    for kind in types:
        if kind == "q4_1":
            found[kind] = smollm2_path()
            continue
        path = folder / f"smollm2-{kind}.gguf"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(ROOT / ".venv" / "bin" / "attnlab"), "export", "gguf",
                            "--model", "smollm2", "--out", str(path), "--type", kind],
                           check=True)
        found[kind] = path
    return found


def run_worker(engine: str, path: Path, kind: str, args) -> dict | None:
    options = dict(path=str(path), kind=kind, threads=args.threads, new=args.new_tokens,
                   prefill=args.prefill)
    if engine.startswith("attnlab-compiled"):
        options["compile"] = True
    if engine.endswith("-bf16"):
        if kind not in ("f32", "f16"):
            print(f"  {engine} skipped on {kind}: it runs float files only", flush=True)
            return None
        options["bf16"] = True
    worker = "attnlab" if engine.startswith("attnlab") else engine
    env = dict(os.environ)
    if worker == "llamacpp" and args.llamacpp_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.llamacpp_path,
                                                          env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, __file__, "--worker", worker, "--json",
                           json.dumps(options)],
                          capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        print(f"  {engine} on {kind} failed (exit {done.returncode}): "
              f"{done.stderr.strip().splitlines()[-1:] or ''}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=["q4_1", "q8_0", "f16", "f32"],
                   choices=["q4_1", "q8_0", "f16", "f32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--engines", nargs="+", default=["attnlab", "attnlab-compiled", "llamacpp"],
                   choices=["attnlab", "attnlab-compiled", "attnlab-compiled-bf16",
                            "llamacpp"],
                   help="attnlab-compiled: generate --compile's one-token step; "
                   "attnlab-compiled-bf16: the same with a float file's weights in bf16")
    p.add_argument("--folder", default=str(ROOT / "runs" / "llamacpp"),
                   help="where the exported f32/f16/q8_0 files are kept")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the engines this many times, taking turns; report medians")
    p.add_argument("--llamacpp-path", help="a folder holding another llama_cpp build")
    p.add_argument("--worker", choices=["attnlab", "llamacpp"], help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        fn = attnlab_worker if args.worker == "attnlab" else llamacpp_worker
        print(json.dumps(fn(**json.loads(args.json))))
        return
    import torch

    from attnlab import hardware

    model, flags = hardware.cpu_flags()
    gbs = bandwidth()
    print(f"machine: {model} ({hardware.isa_summary(flags)}), {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, Python {platform.python_version()}; matrix-vector read "
          f"{gbs:.1f} GB/s; {args.threads} threads\n", flush=True)
    rows, built = [], set()
    for kind, path in files(args.types, Path(args.folder)).items():
        rounds = []
        for r in range(args.rounds):
            rounds.append({e: run_worker(e, path, kind, args) for e in args.engines})
            if args.rounds > 1:
                print(f"{kind} round {r + 1}: " + ", ".join(
                    f"{e} {x['decode_tps']:.1f}" for e, x in rounds[-1].items() if x)
                    + " decode tokens/s" + _round_ratios(rounds[-1]), flush=True)
        results = {e: _median(e, rounds) for e in args.engines}
        for x in results.values():
            if x and x.get("build") and x["build"] not in built:
                built.add(x["build"])
                print(f"llama.cpp's build: {x['build']}", flush=True)
        if args.rounds > 1:
            for ours in ("attnlab", "attnlab-compiled", "attnlab-compiled-bf16"):
                ratios = sorted(x[ours]["decode_tps"] / x["llamacpp"]["decode_tps"]
                                for x in rounds if x.get(ours) and x.get("llamacpp"))
                if ratios:
                    print(f"{kind}: {ours} / llama.cpp in each round: "
                          f"{', '.join(f'{v:.2f}x' for v in ratios)}; median "
                          f"{statistics.median(ratios):.2f}x", flush=True)
        ours = results.get("attnlab") or results.get("attnlab-compiled")
        theirs = results.get("llamacpp")
        same = None
        if ours and theirs:
            same = next((i for i, (a, b) in enumerate(zip(ours["ids"], theirs["ids"], strict=True))
                         if a != b), len(ours["ids"]))
            same = f"{same}/{args.new_tokens}" + ("" if ours["prompt"] == theirs["prompt"]
                                                   else " (prompts differ)")
        eager, compiled = results.get("attnlab"), results.get("attnlab-compiled")
        if eager and compiled:  # the compiled step must not change a token
            print(f"{kind}: attnlab compiled and eager give the same {args.new_tokens} tokens: "
                  f"{compiled['ids'] == eager['ids']}", flush=True)
        for engine, r in results.items():
            if r is None:
                continue
            per_token = r["weight_bytes"] + r["kv_bytes"] * (len(r["prompt"])
                                                             + args.new_tokens / 2)
            limit = gbs * 1e9 / per_token
            rows.append((kind, engine, r["precision"], r["prefill_tps"], r["decode_tps"],
                         per_token / 1e6, limit, same))
            print(f"{kind} {engine}: prefill {r['prefill_tps']:.0f} tokens/s, decode "
                  f"{r['decode_tps']:.1f} tokens/s ({per_token / 1e6:.0f} MB/token, limit "
                  f"{limit:.0f})", flush=True)
    print("\n| file | engine | computes in | prefill tokens/s | decode tokens/s | MB read "
          "per token | limit tokens/s | % of limit | same greedy tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, engine, precision, pre, dec, mb, limit, same in rows:
        print(f"| {kind} | {engine} | {precision} | {pre:.0f} | {dec:.1f} | {mb:.0f} | "
              f"{limit:.0f} | {100 * dec / limit:.0f}% | {same or '-'} |")
    by = {(k, e): d for k, e, _, _, d, *_ in rows}
    for kind in args.types:
        if (kind, "attnlab-compiled-bf16") in by and (kind, "attnlab-compiled") in by:
            print(f"{kind}: attnlab compiled bf16 decodes at "
                  f"{by[kind, 'attnlab-compiled-bf16'] / by[kind, 'attnlab-compiled']:.2f}x "
                  "its fp32 speed")
        for ours in ("attnlab", "attnlab-compiled", "attnlab-compiled-bf16"):
            if (kind, ours) in by and (kind, "llamacpp") in by:
                print(f"{kind}: {ours} decodes at {by[kind, ours] / by[kind, 'llamacpp']:.2f}x "
                      "llama.cpp's speed")


if __name__ == "__main__":
    main()
