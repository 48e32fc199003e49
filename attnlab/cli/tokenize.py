"""``attnlab tokenize train`` (learn a shared byte-level BPE vocabulary) and
``attnlab tokenize encode`` (print the ids, and pieces, of texts)."""

from __future__ import annotations

import argparse

from attnlab.cli.common import UsageError, add_out_arg


def cmd_tokenize_train(args: argparse.Namespace) -> None:
    from pathlib import Path

    from attnlab.errors import MissingFile
    from attnlab.files import read_lines
    from attnlab.tokenizers import BPETokenizer

    if not Path(args.out).resolve().parent.is_dir():
        raise MissingFile(f"--out {args.out}: its folder does not exist")
    texts = [line for path in args.files for line in read_lines(path)]
    if not texts:
        raise UsageError("the input files hold no text")
    tok = BPETokenizer.train(texts, args.vocab_size, args.min_frequency)
    tok.save_hf(args.out)
    print(f"byte-level BPE, {tok.vocab_size} tokens, learned from {len(texts):,} lines of "
          f"{len(args.files)} file(s): {args.out}")


def cmd_tokenize_encode(args: argparse.Namespace) -> None:
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.from_file(args.tokenizer)
    for text in args.text:
        ids = tok.encode(text)
        print(" ".join(map(str, ids)))
        if args.pieces:
            print(" ".join(tok.backend.id_to_token(i) for i in ids))


def add_commands(sub) -> None:
    tk = sub.add_parser("tokenize", help="learn or apply a byte-level BPE vocabulary",
                        description="Byte-level BPE through the tokenizers library.")
    actions = tk.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    tr = actions.add_parser("train", help="learn a shared vocabulary from text files",
                            description="Learn one BPE vocabulary from all FILES together (the "
                                        "paper shares it between source and target).")
    tr.add_argument("files", nargs="+", help="text files (plain or .gz), one sentence a line")
    tr.add_argument("--vocab-size", type=int, default=8000)
    tr.add_argument("--min-frequency", type=int, default=2)
    add_out_arg(tr, "where to write tokenizer.json", "tokenizer.json")
    tr.set_defaults(func=cmd_tokenize_train)
    en = actions.add_parser("encode", help="print the ids of texts",
                            description="Encode texts with a tokenizer.json.")
    en.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    en.add_argument("--pieces", action="store_true", help="also print the pieces")
    en.add_argument("text", nargs="+")
    en.set_defaults(func=cmd_tokenize_encode)
