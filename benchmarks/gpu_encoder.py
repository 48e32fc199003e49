"""Encoder inference on a GPU: attnlab's ``encode`` eager and under ``torch.compile`` against
transformers' ``BertModel`` eager and under ``torch.compile``, and onnxruntime-gpu where its
CUDA provider is installed, side by side in one process.

MiniLM (all-MiniLM-L6-v2's shape: 6 layers, d_model 384, 12 heads) and BERT-base, with
transformers' random initialisation (speed does not depend on the values), saved by
transformers and loaded into attnlab through that folder, so both hold the same numbers.
Batches of ``--len`` tokens; at batch 32 every fourth row is padded after a random length.
Both compiled engines use ``mode="reduce-overhead"`` (CUDA graphs: a 128-token batch 1 is
bound by launches). The hidden states at real tokens are compared with transformers' eager
ones (max |difference|); the engines then alternate call by call.

    python benchmarks/gpu_encoder.py [--models minilm bert-base] [--batches 1 32]
        [--precisions fp32 bf16] [--seconds 5]
    python benchmarks/gpu_encoder.py --device cpu --models minilm --batches 2 --seconds 0.2
        --precisions fp32 --no-compile      # the script's own check, no GPU
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# the onnx package must not be shadowed by benchmarks/onnx.py: drop this folder from the path
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE))  # after the packages: side_by_side, not onnx, comes from here

import torch  # noqa: E402
import transformers  # noqa: E402
from side_by_side import padded_batch  # noqa: E402

from attnlab import from_pretrained, hardware  # noqa: E402

SHAPES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                   intermediate_size=1536),
    "bert-base": {},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fns: dict, seconds: float, device: torch.device) -> dict[str, float]:
    """Seconds a call of each of ``fns``, alternating for about ``seconds`` in all (at least 3
    rounds of 10 calls), after three warm-up calls each (compiling, recording graphs)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    sync(device)
    total, rounds, begun = dict.fromkeys(fns, 0.0), 0, time.perf_counter()
    while rounds < 3 or time.perf_counter() - begun < seconds:
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(10):
                fn()
            sync(device)
            total[name] += (time.perf_counter() - start) / 10
        rounds += 1
    return {name: t / rounds for name, t in total.items()}


def ort_session(theirs, folder: Path, device: torch.device):
    """onnxruntime-gpu on transformers' export, or the reason it cannot run here."""
    try:
        import onnxruntime
    except ImportError:
        return None, "onnxruntime is not installed"
    if device.type != "cuda" or "CUDAExecutionProvider" not in \
            onnxruntime.get_available_providers():
        return None, (f"onnxruntime {onnxruntime.__version__} has no CUDA provider here "
                      f"({', '.join(onnxruntime.get_available_providers())})")

    class Outputs(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(1000, 2000, (2, 16), device=device)
    path = folder / "bert.onnx"
    torch.onnx.export(Outputs(theirs), (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"],
                      dynamic_axes={k: {0: "batch", 1: "seq"}
                                    for k in ["input_ids", "attention_mask", "last_hidden_state"]},
                      opset_version=17, dynamo=False)
    return onnxruntime.InferenceSession(str(path), providers=["CUDAExecutionProvider"]), ""


def run(name: str, precision: str, args, device: torch.device) -> None:
    dtype = DTYPES[precision]
    torch.manual_seed(0)
    config = transformers.BertConfig(**SHAPES[name])
    with tempfile.TemporaryDirectory(prefix="gpu-encoder-") as tmp:
        theirs = transformers.BertModel(config).eval()
        theirs.save_pretrained(tmp)
        ours = from_pretrained(tmp).eval().to(device, dtype)
        theirs = theirs.to(device, dtype)
        session, why = ort_session(theirs, Path(tmp), device) if precision == "fp32" else \
            (None, "fp32 only")
    engines = {"transformers": lambda ids, mask: theirs(input_ids=ids,
                                                          attention_mask=mask).last_hidden_state,
               "attnlab": lambda ids, mask: ours.encode(ids, None, mask)}
    if args.compile:
        engines["transformers-compiled"] = torch.compile(engines["transformers"],
                                                         mode="reduce-overhead")
        engines["attnlab-compiled"] = torch.compile(engines["attnlab"], mode="reduce-overhead")
    if session is not None:
        engines["onnxruntime-gpu"] = lambda ids, mask: session.run(
            None, {"input_ids": ids.cpu().numpy(), "attention_mask": mask.cpu().numpy()})[0]
    print(f"\n{name}, {precision}: onnxruntime-gpu {'runs' if session else 'absent: ' + why}")
    print("| batch | " + " | ".join(engines) + " | attnlab compiled / transformers compiled "
          "| attnlab / transformers | max diff against transformers eager |")
    print("|---|" + "---|" * (len(engines) + 3))
    for n in args.batches:
        ids, mask = (t.to(device) for t in padded_batch(config.vocab_size, n, args.len))
        calls = {k: (lambda fn=fn, ids=ids, mask=mask: fn(ids, mask)) for k, fn in engines.items()}
        with torch.inference_mode():
            real = mask.bool()
            reference = calls["transformers"]().float()
            diffs = []
            for k, call in calls.items():
                out = torch.as_tensor(call()).to(device).float()
                diffs.append(f"{k} {float((out - reference).abs()[real].max()):.1e}")
            seconds = timed(calls, args.seconds, device)
        rate = {k: n / s for k, s in seconds.items()}
        ratio = (f"{rate['attnlab-compiled'] / rate['transformers-compiled']:.2f}x"
                 if args.compile else "-")
        print(f"| {n} | " + " | ".join(f"{r:,.0f}" for r in rate.values()) +
              f" | {ratio} | {rate['attnlab'] / rate['transformers']:.2f}x | "
              f"{'; '.join(diffs[1:])} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    p.add_argument("--len", type=int, default=128, help="tokens a sentence")
    p.add_argument("--seconds", type=float, default=5.0, help="timing per batch size")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    args = p.parse_args()
    device = torch.device(args.device)
    print(hardware.report())
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; sentences/s, "
          f"{args.len} tokens; transformers' attention: sdpa")
    for name in args.models:
        for precision in args.precisions:
            run(name, precision, args, device)


if __name__ == "__main__":
    main()
