"""``attnlab export gguf`` and ``attnlab export onnx``: a model into another engine's file format
(llama.cpp's GGUF; ONNX graphs for onnxruntime)."""

from __future__ import annotations

import argparse
import sys

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg


def cmd_export_gguf(args: argparse.Namespace) -> None:
    from attnlab.interop.gguf_write import save_gguf
    from attnlab.storage import load

    if not str(args.out).endswith(".gguf"):
        raise UsageError(f"--out {args.out}: a GGUF file's name ends in .gguf")
    from attnlab.generation.chat import template_source

    loaded = load(args.model, adapter=args.adapter).expect("decoder", "export gguf")
    template = template_source(loaded.path)  # the chat template travels with the model
    path = save_gguf(loaded.model, loaded.tokenizer, args.out, args.type, template)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, matrices in {args.type}"
          f"{', with its chat template' if template else ''})")


def cmd_export_onnx(args: argparse.Namespace) -> None:
    from attnlab.interop.onnx_export import (
        check_destination,
        check_exportable,
        export_onnx,
        require_onnx,
    )
    from attnlab.storage import load

    require_onnx()  # what can be checked before the model loads, first
    out = check_destination(args.out)
    loaded = load(args.model, adapter=args.adapter)
    check_exportable(loaded.model, loaded.path)
    manifest = export_onnx(loaded.model, out,
                           {role: t.to_dict() for role, t in loaded.tokenizers.items()})
    files = ", ".join(f"{g['file']} ({(out / g['file']).stat().st_size / 2**20:.1f} MiB)"
                      for g in manifest["graphs"].values())
    errors = [g["max_abs_error"] for g in manifest["graphs"].values()
              if g.get("max_abs_error") is not None]
    check = (f"; max |onnxruntime - attnlab| {max(errors):.1e} on the export's inputs"
             if errors else "")
    print(f"wrote {out}: {files}, opset {manifest['opset']}{check}")
    if errors and max(errors) > 1e-4:  # float32 graphs agree far closer than that
        print(f"attnlab export: warning: onnxruntime differs from attnlab by {max(errors):.1e} "
              "(more than 1e-4) on the export's inputs; check the graphs before using them",
              file=sys.stderr)


def add_commands(sub) -> None:
    ex = sub.add_parser("export", help="write a model in another engine's format",
                        description="Write a model in another engine's file format.")
    formats = ex.add_subparsers(dest="format", required=True, metavar="FORMAT")
    g = formats.add_parser("gguf", help="llama.cpp's GGUF (Llama-architecture models)",
                           description="Write a Llama-architecture decoder and its byte-level "
                           "BPE tokenizer as a GGUF file that llama.cpp and attnlab read.")
    add_model_arg(g, "a run, model folder, Hugging Face folder or .gguf file")
    add_out_arg(g, "the .gguf file to write", required=True)
    g.add_argument("--type", choices=["f32", "f16", "q8_0", "q4_1"], default="f32",
                   help="the matrices' type (norms stay f32)")
    g.set_defaults(func=cmd_export_gguf)
    o = formats.add_parser(
        "onnx", help="ONNX graphs for onnxruntime (encoder, decoder, encoder-decoder models)",
        description="Write a model as float32 ONNX graphs with dynamic batch and sequence "
        "axes: an encoder's forward pass; a decoder's step with its KV cache as inputs "
        "(past_key_values.*) and outputs (present.*); an encoder-decoder's encoder and "
        "decoder step. The folder also holds export.json (each graph's inputs and outputs) "
        "and the tokenizers; attnlab.interop.onnx_run runs it.")
    add_model_arg(o, "a run, model folder, Hugging Face folder, .gguf file or alias "
                  "(minilm, smollm2)")
    add_out_arg(o, "the folder to write (new, empty, or an earlier ONNX export)", required=True)
    o.set_defaults(func=cmd_export_onnx)
