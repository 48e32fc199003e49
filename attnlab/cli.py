"""The ``attnlab`` command line.

Every subcommand has ``--help``. Bad input ends with one line on stderr naming the problem and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


class UsageError(Exception):
    """A problem with the user's input: reported in one line, exit code 2."""


def _parse_override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string such as positional=rope


def cmd_info(args: argparse.Namespace) -> None:
    from attnlab import ModelConfig, Transformer, parameter_breakdown

    overrides = dict(_parse_override(s) for s in args.set)
    config = ModelConfig.from_preset(args.preset, **overrides)
    model = Transformer(config)
    placement = {"post": "post-LN  x ← Norm(x + Sublayer(x))",
                 "pre": "pre-LN  x ← x + Sublayer(Norm(x))"}[config.norm_placement]
    rows = [
        ("architecture", config.arch),
        ("layers", f"{config.n_encoder_layers} encoder + {config.n_decoder_layers} decoder"),
        ("d_model", config.d_model),
        ("heads", f"{config.n_heads} (kv heads {config.kv_heads})"),
        ("d_k = d_v", config.d_k),
        ("d_ff", config.d_ff),
        ("dropout", f"{config.dropout} (attention {config.attention_dropout})"),
        ("positional encoding", config.positional),
        ("norm", f"{config.norm}, {placement}"),
        ("activation", config.activation),
        ("vocabulary", f"{config.vocab_size}" + (" shared" if config.tgt_vocab_size is None
                                                  else f" / {config.tgt_vocab_size}")),
        ("tied embeddings", config.tie_embeddings),
        ("max length", config.max_len),
    ]
    print(f"preset {args.preset}")
    for key, value in rows:
        print(f"  {key:<20} {value}")
    print("\nparameters")
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<20} {count:>13,}  ({count / 1e6:.2f}M)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab", description="Build, train, run and inspect Transformers."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="print a preset's architecture and parameter counts",
                          description="Print a preset's architecture and parameter table.")
    info.add_argument("--preset", default="base", help="preset name (base, big, small, tiny)")
    info.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. --set positional=rope")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (UsageError, ValueError, FileNotFoundError, TypeError) as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
