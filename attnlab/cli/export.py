"""``attnlab export gguf``: a model into another engine's file format (llama.cpp's GGUF)."""

from __future__ import annotations

import argparse

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg


def cmd_export_gguf(args: argparse.Namespace) -> None:
    from attnlab.interop.gguf_write import save_gguf
    from attnlab.storage import load

    if not str(args.out).endswith(".gguf"):
        raise UsageError(f"--out {args.out}: a GGUF file's name ends in .gguf")
    loaded = load(args.model).expect("decoder", "export gguf")
    path = save_gguf(loaded.model, loaded.tokenizer, args.out, args.type)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, matrices in {args.type})")


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
