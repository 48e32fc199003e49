"""``--help`` of every command shows every option's default, ``--preset`` lists the presets,
and ``attnlab --version`` prints the installed package's version."""

import argparse
import importlib.metadata

import pytest

from attnlab.cli import build_parser
from attnlab.config import PRESETS
from tests.cli.helpers import cli


def parsers(parser: argparse.ArgumentParser, name: str = "attnlab"):
    """``(name, parser)`` of the command line and of every command and subcommand in it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


ALL = dict(parsers(build_parser()))


def test_every_command_is_walked():
    assert {"attnlab train translate", "attnlab train lm", "attnlab generate", "attnlab embed",
            "attnlab tokenize train", "attnlab plot", "attnlab demo"} <= set(ALL)


@pytest.mark.parametrize("name", sorted(ALL))
def test_help_shows_every_default(name):
    parser = ALL[name]
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    shown = 0
    for action in parser._actions:
        default = action.default
        if (not action.option_strings or action.nargs == 0 or default is None
                or default == [] or default is argparse.SUPPRESS):
            continue
        assert f"default: {default}" in text, f"{name} {action.option_strings[0]}: no default"
        shown += 1
    if name in ("attnlab train translate", "attnlab train lm", "attnlab generate"):
        assert shown >= 4


@pytest.mark.parametrize("name, arch", [("attnlab train translate", "encoder-decoder"),
                                        ("attnlab train lm", "decoder"),
                                        ("attnlab train mlm", "encoder")])
def test_preset_help_lists_the_presets_of_the_command(name, arch):
    text = " ".join(ALL[name].format_help().split()).replace("- ", "-")
    listed = text.split("model preset: ")[1].split(" (default")[0].split(", ")
    assert listed == [p for p, fields in PRESETS.items()
                      if fields.get("arch", "encoder-decoder") == arch]


def test_version_prints_the_package_version(capsys):
    """The source's version, which the installed metadata must agree with (pyproject.toml
    reads it from attnlab/version.py)."""
    from attnlab import __version__

    r = cli(capsys, "--version")
    assert r.code == 0 and r.out == f"attnlab {__version__}\n"
    assert importlib.metadata.version("attnlab") == __version__
