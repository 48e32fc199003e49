"""``attnlab quantize``: a model folder made smaller, for every family.

* ``quantize``: post-training weight-only quantisation (int8 per channel, int4 or int2 in
  groups), or int8 weights with dynamic int8 activations for encoders. The output is a model
  folder with ``quantization.json`` (:mod:`attnlab.compression.quantize`), which
  :func:`attnlab.load`, and so every command, reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg


def _size(path: Path) -> int:
    """Bytes on disk of a file, or of a folder's files."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cmd_quantize(args: argparse.Namespace) -> None:
    import warnings

    from torch import nn

    from attnlab.compression.quantize import (
        SPEC_FILE,
        check,
        quantize_model,
        slow_here,
        write_spec,
    )
    from attnlab.storage import load, save_model_dir

    check(args.bits, args.group, args.activations)
    loaded = load(args.model)
    model = loaded.model
    if args.activations == "dynamic" and loaded.kind != "encoder":
        raise UsageError(f"--activations dynamic is for encoders (BERT, MiniLM); {args.model} "
                         f"is a {loaded.kind} model: quantise its weights only")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if args.bits < 8:  # every layer the codes can take must split into whole groups
        for name, layer in linears.items():
            if not name.endswith("lm_head") and layer.in_features % args.group:
                raise UsageError(f"--group {args.group} does not divide the width "
                                 f"{layer.in_features} of {name}")
    slow = slow_here(args.activations)
    if slow:  # said where the model is made; every load of it says it again
        warnings.warn(slow, stacklevel=2)
    spec = quantize_model(model, args.bits, args.group, args.activations)
    kept = [n for n in linears if n not in spec["modules"]]
    folder = save_model_dir(args.out, model, loaded.config,
                            {k: t.to_dict() for k, t in loaded.tokenizers.items()},
                            extra_files={SPEC_FILE: write_spec(spec)})
    what = {8: "int8, one scale per output channel", 4: f"int4 in groups of {args.group}",
            2: f"int2 in groups of {args.group}"}[args.bits]
    print(f"quantised {len(spec['modules'])} linear layers to {what}"
          + (", activations int8 per call" if args.activations == "dynamic" else ""))
    for name in kept:
        layer = linears[name]
        if name.endswith("lm_head"):
            tied = getattr(model, "embed", None) is not None and layer.weight is model.embed.weight
            why = "the output projection" + (", tied to the embedding" if tied else "")
        else:
            why = f"{layer.out_features} outputs; the int4 kernel tiles 16 rows"
        print(f"kept in float: {name} ({why})")
    if args.bits == 2:
        print("note: PyTorch has no 2-bit kernel: the codes are stored at 2 bits and run "
              "through the 4-bit one (4 bits in memory, int4's speed)")
    rest = ("float32 (the dynamic int8 GEMM's input)" if args.activations == "dynamic"
            else "bfloat16 (the kernels compute in bf16)")
    print(f"the other weights (embeddings, norms) in {rest}")
    before = _size(Path(loaded.path))
    print(f"{_size(folder) / 2**20:,.1f} MiB on disk (from {before / 2**20:,.1f} MiB)")
    print(f"model in {folder}")


def add_commands(sub) -> None:
    q = sub.add_parser(
        "quantize", help="post-training quantisation to int8, int4 or int2",
        description="Weight-only post-training quantisation of a model's linear layers: int8 "
                    "with one scale per output channel, int4 or int2 in groups of --group "
                    "inputs (a scale and a zero point each), or int8 weights with dynamic int8 "
                    "activations for encoders (PyTorch's quantized::linear_dynamic). The "
                    "output projection stays float. The result is a model folder every "
                    "command runs, on the CPU.")
    add_model_arg(q, "any model attnlab loads: a run or model folder, an HF folder, a .gguf "
                     "file, minilm, smollm2")
    q.add_argument("--bits", type=int, required=True, help="bits per weight: 8, 4 or 2")
    q.add_argument("--group", type=int, default=32,
                   help="inputs per scale for int4 and int2 (32, 64 or 128)")
    q.add_argument("--activations", choices=["float", "dynamic"], default="float",
                   help="int8 only: float (weight-only) or dynamic (activations quantised to "
                        "int8 at every call: fast where the CPU has VNNI or AMX)")
    add_out_arg(q, "the quantised model folder", required=True)
    q.set_defaults(func=cmd_quantize)
