"""The ``attnlab`` command line: one module per command family, assembled here.

Every subcommand has ``--help``. attnlab's own errors (bad input, a missing file, an
unsupported format: :mod:`attnlab.errors`) end with one line on stderr naming the problem and
exit code 2, and so does an operating-system error on a path the user named (a folder that
cannot be created, a file that cannot be written). Anything else is a bug in attnlab: its
traceback is shown, with a line saying so.
``--debug`` shows the traceback of attnlab's own errors too.

Only the module of the command being run is imported and asked for its options, so a command
runs no other command's code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings
from collections.abc import Sequence

# command -> the module (attnlab.cli.<module>) that defines it, in the order --help lists them
COMMANDS = {
    "info": "info", "train": "train", "average": "train", "generate": "generate",
    "translate": "translate", "evaluate": "translate", "classify": "encoder",
    "embed": "encoder", "explain": "explain", "plot": "explain", "tokenize": "tokenize",
    "demo": "demo",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or only for ``command``'s family."""
    parser = argparse.ArgumentParser(
        prog="attnlab", description="Build, train, run and inspect Transformers.")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of every error, not only of internal ones")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for module in dict.fromkeys(wanted):  # each family once, in order
        importlib.import_module(f"attnlab.cli.{module}").add_commands(sub)
    return parser


def _one_line_warning(message, category, *rest, **kwargs) -> None:
    print(f"attnlab: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    from attnlab import hardware
    from attnlab.errors import AttnlabError

    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    hardware.use_threads()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            args.func(args)
    except AttnlabError as e:
        if args.debug:
            traceback.print_exc()
        print(f"attnlab {args.command}: {'stopped' if e.exit_code != 2 else 'error'}: {e}",
              file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if e.filename is None:  # not about a path: a bug
            return _internal_error(args.command)
        if args.debug:
            traceback.print_exc()
        print(f"attnlab {args.command}: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except Exception:
        return _internal_error(args.command)
    return 0


def _internal_error(command: str) -> int:
    traceback.print_exc()
    print(f"attnlab {command}: internal error: the traceback above is a bug in attnlab; "
          "please report it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
