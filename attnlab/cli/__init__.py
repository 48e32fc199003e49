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
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

# command -> the module (attnlab.cli.<module>) that defines it, in the order --help lists them
COMMANDS = {
    "info": "info", "train": "train", "average": "train", "generate": "generate",
    "translate": "translate", "evaluate": "evaluate", "classify": "apply",
    "embed": "apply", "ner": "apply", "qa": "apply", "explain": "explain", "plot": "plot",
    "tokenize": "tokenize",
    "quantize": "compress", "prune": "compress", "export": "export", "serve": "serve",
    "demo": "demo", "chat": "chat",
}


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return bool(action.option_strings) and action.nargs != 0 and not (  # not a flag
        default is None or default is False or default is argparse.SUPPRESS or default == [])


class _ShowDefaults(argparse.HelpFormatter):
    """``--help`` shows every option's default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _shows_default(action) and "default" not in text:
            text = f"{text} (default: %(default)s)"
        return text

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse's own, except that a name is never cut at its hyphen ("electra-small")
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help shows defaults, which takes no abbreviated option
    (``--max-new-tok 5`` would silently mean ``--max-new-tokens``), names an unknown option
    with the nearest known one, and says what is wrong in one line; subcommands' parsers are
    one too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _ShowDefaults)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        if args is not None:  # a group's options end where its subcommand's name begins
            args = list(args)
            own = args if not self._subparsers else args[:next(
                (i for i, a in enumerate(args) if not a.startswith("-")), len(args))]
            self._check_options(own)
        return super().parse_known_args(args, namespace)

    def _check_options(self, args: list[str]) -> None:
        """An unknown ``--option`` before argparse's own checks: otherwise a misspelt required
        option reads as a missing one ("the following arguments are required: --prompt")."""
        import difflib

        known = list(self._option_string_actions)
        for arg in args:
            if arg == "--":
                return
            name = arg.split("=", 1)[0]
            if name.startswith("--") and name not in known:
                near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]}?" if near else f" (see {self.prog} --help)"
                self.error(f"unknown option {name}{hint}")

    def error(self, message: str):
        """One line naming the problem, exit code 2 (``--help`` shows the usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if not action.help and _shows_default(action):  # argparse prints no empty help
            action.help = "(default: %(default)s)"
        return action


# a command that became a group -> the subcommand its old flat form (options right after the
# command's name) still runs, after a deprecation note
LEGACY = {"evaluate": "translate"}


def _legacy(argv: list[str], command: str | None) -> list[str]:
    """``argv`` with a deprecated flat form rewritten to its subcommand (and a note said)."""
    if command not in LEGACY:
        return argv
    at = argv.index(command) + 1
    if at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-h", "--help"):
        print(f"attnlab: warning: 'attnlab {command} --...' is deprecated and goes in the next "
              f"release; use 'attnlab {command} {LEGACY[command]} --...'", file=sys.stderr)
        return [*argv[:at], LEGACY[command], *argv[at:]]
    return argv


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or only for ``command``'s family."""
    from attnlab.version import __version__

    parser = _Parser(prog="attnlab", description="Build, train, run and inspect Transformers.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
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
    argv = _legacy(argv, command)
    args = build_parser(command).parse_args(argv)
    hardware.use_threads()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            args.func(args)
            sys.stdout.flush()  # a broken pipe shows here, not at exit
    except BrokenPipeError:  # `attnlab embed --json | head`: the reader is gone, end quietly
        _drop_stdout()
        return 141  # 128 + SIGPIPE, what a command killed by the broken pipe returns
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


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _internal_error(command: str) -> int:
    traceback.print_exc()
    print(f"attnlab {command}: internal error: the traceback above is a bug in attnlab; "
          "please report it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
