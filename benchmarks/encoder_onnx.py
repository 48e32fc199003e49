"""Encoder inference against onnxruntime with its transformer fusions: MiniLM and BERT-base, the
same weights, side by side in one process, the same number of intra-op threads.

onnxruntime's side is what people who serve BERT-class models on a CPU run: transformers'
``BertModel`` exported by ``torch.onnx.export`` and rewritten by
``onnxruntime.transformers.optimizer`` (the fused operators it made are printed: Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization), float32. attnlab's side loads the
same transformers folder and runs ``encode``:

* ``attnlab nn.Linear``: the model as built, nn.Linear's products;
* ``attnlab fp32``: :func:`attnlab.cpu.encoder.for_encoding` in fp32 (what ``embed`` and
  ``classify`` run on a CPU in fp32);
* ``attnlab auto``: the same in the precision ``--precision auto`` picks here (bf16 products on
  a CPU with native bf16, else fp32).

Batches of ``--len`` tokens; at batch 32 every fourth row is padded after a random length. The
hidden states at real tokens are compared with onnxruntime's (max |difference|), and auto's
mean-pooled sentence vectors by their lowest cosine with fp32's; then the engines alternate
call by call. MiniLM's weights are all-MiniLM-L6-v2's; BERT-base's are transformers' random
initialisation of ``BertConfig()`` (speed does not depend on the values).

    .venv/bin/python benchmarks/encoder_onnx.py [--models minilm bert-base] [--batches 1 32]
        [--len 128] [--threads 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import tempfile
import time
from pathlib import Path

# the onnx package must not be shadowed by benchmarks/onnx.py: drop this folder from the path
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE))  # after the packages: side_by_side, not onnx, comes from here

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from side_by_side import padded_batch  # noqa: E402

from attnlab import from_pretrained, hardware  # noqa: E402
from attnlab.cpu.encoder import for_encoding  # noqa: E402


class _Outputs(torch.nn.Module):
    """transformers' BertModel with positional inputs and the hidden states out, to export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state


def reference(name: str, folder: Path):
    """transformers' BertModel (eager attention, which the optimizer's patterns match), saved
    to ``folder``."""
    if name == "minilm":
        from attnlab.storage import minilm_path

        theirs = transformers.BertModel.from_pretrained(minilm_path(),
                                                        attn_implementation="eager")
    else:
        torch.manual_seed(0)
        theirs = transformers.BertModel(transformers.BertConfig(attn_implementation="eager"))
    theirs.eval().save_pretrained(folder)
    return theirs


def fused_session(theirs, folder: Path, threads: int):
    import onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model

    ids = torch.randint(1000, 2000, (2, 16))
    path = folder / "bert.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(_Outputs(theirs), (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                      str(path), input_names=names, output_names=["last_hidden_state"],
                      dynamic_axes={k: {0: "batch", 1: "seq"}
                                    for k in [*names, "last_hidden_state"]},
                      opset_version=17, dynamo=False)
    config = theirs.config
    optimized = optimize_model(str(path), model_type="bert",
                               num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.save_model_to_file(str(folder / "bert-fused.onnx"))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(folder / "bert-fused.onnx"), options,
                                           providers=["CPUExecutionProvider"])
    return session, fused



def timed(fns: dict, seconds: float) -> dict[str, float]:
    """Seconds a call of each of ``fns``, alternating call by call for about ``seconds`` in all
    (at least 3 rounds), after one warm-up call each."""
    for fn in fns.values():
        fn()
    total, rounds, begun = dict.fromkeys(fns, 0.0), 0, time.perf_counter()
    while rounds < 3 or time.perf_counter() - begun < seconds:
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            total[name] += time.perf_counter() - start
        rounds += 1
    return {name: t / rounds for name, t in total.items()}


def pooled(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(h.dtype)
    u = (h * m).sum(1) / m.sum(1)
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def run(name: str, args, auto: str) -> None:
    with tempfile.TemporaryDirectory(prefix="encoder-onnx-") as tmp:
        folder = Path(tmp)
        theirs = reference(name, folder / "hf")
        session, fused = fused_session(theirs, folder, args.threads)
        plain = from_pretrained(folder / "hf").eval()
        fp32 = copy.deepcopy(plain)
        for_encoding(fp32, "fp32")
        low = copy.deepcopy(plain)
        if not for_encoding(low, auto) and auto != "fp32":  # not packed here: autocast's
            auto += " under autocast"

    def auto_encode(ids, types, mask):
        with hardware.autocast(torch.device("cpu"), auto.split()[0]) if "autocast" in auto \
                else contextlib.nullcontext():
            return low.encode(ids, types, mask)

    print(f"\n{name}: onnxruntime's fused operators {fused}")
    print(f"| batch | onnxruntime fused | attnlab nn.Linear | attnlab fp32 | attnlab auto ({auto}) "
          f"| fp32 / onnxruntime | auto / onnxruntime | max diff fp32 | auto's lowest cosine |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.batches:
        ids, mask = padded_batch(plain.config.vocab_size, n, args.len)
        types = torch.zeros_like(ids)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                 "token_type_ids": types.numpy()}
        engines = {"ort": lambda feeds=feeds: session.run(None, feeds)[0],
                   "plain": lambda ids=ids, types=types, mask=mask: plain.encode(ids, types, mask),
                   "fp32": lambda ids=ids, types=types, mask=mask: fp32.encode(ids, types, mask),
                   "auto": lambda ids=ids, types=types, mask=mask: auto_encode(ids, types, mask)}
        with torch.inference_mode():
            real = mask.bool().numpy()
            ort = engines["ort"]()
            ours = engines["fp32"]().numpy()
            diff = float(np.abs(ours - ort)[real].max())
            cosine = float((pooled(engines["auto"]().numpy(), mask.numpy())
                            * pooled(ours, mask.numpy())).sum(-1).min())
            seconds = timed(engines, args.seconds)
        rate = {k: n / s for k, s in seconds.items()}
        print(f"| {n} | {rate['ort']:.1f} | {rate['plain']:.1f} | {rate['fp32']:.1f} | "
              f"{rate['auto']:.1f} | {rate['fp32'] / rate['ort']:.2f}x | "
              f"{rate['auto'] / rate['ort']:.2f}x | {diff:.1e} | {cosine:.6f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=["minilm", "bert-base"],
                   default=["minilm", "bert-base"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--len", type=int, default=128, help="tokens a sentence")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of each engine")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="timing per batch size, all engines together")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import onnxruntime

    auto = hardware.pick_precision("auto", torch.device("cpu"), warn=False)
    auto = auto if auto in ("fp32", "bf16") else "fp32"
    print(hardware.report())
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, transformers "
          f"{transformers.__version__}, {args.threads} threads each; sentences/s, "
          f"{args.len} tokens")
    for name in args.models:
        run(name, args, auto)


if __name__ == "__main__":
    main()
