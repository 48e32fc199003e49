"""Every public name the README shows still works: each ``from attnlab... import ...`` in its
Python examples imports, each ``attnlab.name`` it mentions exists, and each ``attnlab COMMAND``
line of its shell examples names a command whose options parse."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import attnlab
from attnlab.cli import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)


def test_python_imports_in_the_readme_work():
    imports = [line.strip() for lang, body in BLOCKS if lang == "python"
               for line in body.splitlines() if line.strip().startswith("from attnlab")]
    assert len(imports) >= 4
    for line in imports:
        module, names = re.match(r"from (\S+) import (.+?)(\s+#.*)?$", line).group(1, 2)
        imported = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(imported, name.strip()), f"{module}.{name.strip()}"


def test_attnlab_names_in_the_readme_exist():
    names = set(re.findall(r"\battnlab\.([a-z_][a-z_0-9]*)\b(?!/|\.py)", README))
    assert {"load", "from_pretrained", "save_pretrained"} <= names
    for name in names:
        assert hasattr(attnlab, name) or importlib.util.find_spec(f"attnlab.{name}"), name


def test_readme_commands_parse():
    parser = build_parser()
    commands = [line.split("#")[0].strip() for lang, body in BLOCKS if lang == "bash"
                for line in body.replace("\\\n", " ").splitlines()
                if line.strip().startswith("attnlab ") and "..." not in line]
    assert len(commands) >= 15
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])  # SystemExit (a failure) if it does not
