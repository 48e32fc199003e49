"""``attnlab tokenize train`` (learn a byte-level BPE or a WordPiece vocabulary),
``attnlab tokenize encode`` (print the ids, and pieces, of texts) and ``attnlab tokenize stats``
(what a tokenizer makes of text files: compression, fertility, OOV rate, vocabulary used)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from attnlab.cli.common import UsageError, add_out_arg

if TYPE_CHECKING:  # the CLI imports torch only when a command needs it
    from attnlab.tokenizers import Tokenizer

TOKENIZER_HELP = ("a tokenizer: tokenizer.json (byte-level BPE or WordPiece), a tokenizer JSON "
                  "attnlab saved, a vocab.txt, a folder with GPT-2's encoder.json and vocab.bpe, "
                  "or a model (a run folder, a Hugging Face folder, minilm)")


def resolve_tokenizer(spec: str, role: str | None = None) -> Tokenizer:
    """The tokenizer ``spec`` names (see ``TOKENIZER_HELP``); ``role`` picks one of a
    translation model's two (source, target)."""
    from pathlib import Path

    from attnlab.errors import BadInput
    from attnlab.files import parse_json, read_text
    from attnlab.tokenizers import KINDS, BPETokenizer, WordPieceTokenizer, tokenizer_from_dict

    path = Path(spec)
    if path.is_file() and path.suffix == ".json":
        data = parse_json(read_text(path, "tokenizer file"), path, "tokenizer JSON")
        if data.get("type") in KINDS:  # attnlab's own save()
            try:
                return tokenizer_from_dict(data)
            except BadInput as e:
                raise BadInput(f"{path}: {e}") from None
        model = data.get("model")
        if isinstance(model, dict) and model.get("type") == "WordPiece":
            return WordPieceTokenizer.from_file(path)
        return BPETokenizer.from_file(path)
    if path.is_file() or (path.is_dir() and not (path / "config.json").exists()
                          and (path / "vocab.txt").exists()):
        return WordPieceTokenizer.from_file(path)  # a vocab.txt, or a folder holding one
    if (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
        return BPETokenizer.from_gpt2_files(path / "encoder.json", path / "vocab.bpe")
    from attnlab.storage import load

    tokenizers = load(spec).tokenizers
    if role is not None:
        if role not in tokenizers:
            raise UsageError(f"--role {role}: {spec} has a {' and a '.join(tokenizers)} "
                             "tokenizer")
        return tokenizers[role]
    if not tokenizers:
        raise BadInput(f"{spec}: the model has no tokenizer")
    if len({id(t) for t in tokenizers.values()}) > 1:
        raise UsageError(f"{spec} has a {' and a '.join(tokenizers)} tokenizer: pick one with "
                         "--role")
    return next(iter(tokenizers.values()))


def piece(tok: Tokenizer, i: int) -> str:
    """Token ``i`` as the vocabulary writes it (byte-level BPE: ``Ġ`` for a space)."""
    backend = getattr(tok, "backend", None)
    return backend.id_to_token(i) if backend is not None else tok.vocab[i]


def cmd_tokenize_train(args: argparse.Namespace) -> None:
    from pathlib import Path

    from attnlab.errors import MissingFile
    from attnlab.files import read_lines
    from attnlab.tokenizers import BPETokenizer, WordPieceTokenizer

    if not Path(args.out).resolve().parent.is_dir():
        raise MissingFile(f"--out {args.out}: its folder does not exist")
    texts = [line for path in args.files for line in read_lines(path)]
    if not any(t.strip() for t in texts):
        raise UsageError("the input files hold no text")
    if args.model == "wordpiece":
        tok = WordPieceTokenizer.train(args.files, args.vocab_size,
                                       min_frequency=args.min_frequency)
        tok.backend.save(str(args.out))
        what = "WordPiece (merged by count(ab) / (count(a)·count(b)), lower-cased)"
    else:
        tok = BPETokenizer.train(texts, args.vocab_size, args.min_frequency)
        tok.save_hf(args.out)
        what = "byte-level BPE"
    print(f"{what}, {tok.vocab_size} tokens, learned from {len(texts):,} lines of "
          f"{len(args.files)} file(s): {args.out}")


def cmd_tokenize_encode(args: argparse.Namespace) -> None:
    tok = resolve_tokenizer(args.tokenizer, args.role)
    for text in args.text:
        ids = tok.encode(text)
        print(" ".join(map(str, ids)))
        if args.pieces:
            print(" ".join(piece(tok, i) for i in ids))


def _ratio(num: int, den: int, percent: bool = False) -> str:
    if den == 0:
        return "n/a"
    return f"{100 * num / den:.2f}%" if percent else f"{num / den:.3f}"


def cmd_tokenize_stats(args: argparse.Namespace) -> None:
    from attnlab.files import read_lines
    from attnlab.tokenizers import text_stats

    tok = resolve_tokenizer(args.tokenizer, args.role)
    s = text_stats(tok, (line for path in args.files for line in read_lines(path)))
    if s.words == 0:
        raise UsageError("the input files hold no text")
    backend = getattr(tok, "backend", None)
    byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
    print(f"tokenizer: {tok.kind}, vocabulary of {s.vocab_size:,} ({args.tokenizer})")
    print(f"text: {len(args.files)} file(s), {s.lines:,} line(s), {s.characters:,} characters, "
          f"{s.words:,} words")
    print(f"compression: {_ratio(s.characters, s.tokens)} characters per token "
          f"({s.characters:,} characters / {s.tokens:,} tokens)")
    print(f"fertility: {_ratio(s.tokens, s.words)} tokens per word "
          f"({s.tokens:,} tokens / {s.words:,} words)")
    if byte_level:
        print("OOV rate: none possible: byte-level BPE spells any text in bytes, so no token "
              "is unknown")
    elif tok.unk_id is None:
        print("OOV rate: none possible: this tokenizer has no unknown token")
    else:
        print(f"OOV rate: {_ratio(s.unknown, s.tokens, percent=True)} of tokens unknown "
              f"({s.unknown:,} of {s.tokens:,} tokens are {piece(tok, tok.unk_id)}, "
              f"id {tok.unk_id})")
    print(f"vocabulary used: {_ratio(s.distinct, s.vocab_size, percent=True)} "
          f"({s.distinct:,} distinct ids of {s.vocab_size:,})")


def add_commands(sub) -> None:
    tk = sub.add_parser("tokenize", help="learn, apply or measure a tokenizer",
                        description="Learn a byte-level BPE or WordPiece vocabulary, encode "
                                    "texts with a tokenizer, or measure one on text files.")
    actions = tk.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    tr = actions.add_parser("train", help="learn a shared vocabulary from text files",
                            description="Learn one vocabulary from all FILES together (the "
                                        "paper shares it between source and target). BPE "
                                        "merges the most frequent pair; WordPiece the pair "
                                        "with the highest count(ab) / (count(a)·count(b)).")
    tr.add_argument("files", nargs="+", help="text files (plain or .gz), one sentence a line")
    tr.add_argument("--model", choices=["bpe", "wordpiece"], default="bpe",
                    help="byte-level BPE or WordPiece (lower-cased, as BERT uncased)")
    tr.add_argument("--vocab-size", type=int, default=8000)
    tr.add_argument("--min-frequency", type=int, default=2,
                    help="merge only pairs seen at least this often")
    add_out_arg(tr, "where to write tokenizer.json", "tokenizer.json")
    tr.set_defaults(func=cmd_tokenize_train)
    en = actions.add_parser("encode", help="print the ids of texts",
                            description="Encode texts with a tokenizer.")
    en.add_argument("--tokenizer", required=True, help=TOKENIZER_HELP)
    en.add_argument("--role", choices=["source", "target"],
                    help="which of a translation model's tokenizers")
    en.add_argument("--pieces", action="store_true", help="also print the pieces")
    en.add_argument("text", nargs="+")
    en.set_defaults(func=cmd_tokenize_encode)
    st = actions.add_parser("stats", help="compression, fertility, OOV rate, vocabulary used",
                            description="Encode each line of FILES and print characters per "
                                        "token, tokens per (whitespace-separated) word, the "
                                        "share of unknown tokens and of the vocabulary used, "
                                        "each with its counts.")
    st.add_argument("--tokenizer", required=True, help=TOKENIZER_HELP)
    st.add_argument("--role", choices=["source", "target"],
                    help="which of a translation model's tokenizers")
    st.add_argument("files", nargs="+", help="UTF-8 text files (plain or .gz)")
    st.set_defaults(func=cmd_tokenize_stats)
