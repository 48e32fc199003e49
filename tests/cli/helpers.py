"""Running ``attnlab`` in-process as a user runs it, the contract for bad input, and a tiny
random encoder to fine-tune.

``main(argv)`` returns the exit code. What escapes it (an exception, argparse's SystemExit) is
turned into what the console script would give the user: a traceback on stderr and exit code 1,
or argparse's own code, so that a test of bad input fails on its assertions, naming the bug,
instead of erroring out.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab import BERT, ModelConfig, save_pretrained
from attnlab.cli import main
from attnlab.tokenizers import WordPieceTokenizer

RUNNING = re.compile(r"^attnlab [a-z]+: running .+ on \S+, .+, \d+ threads$")


@dataclass
class Result:
    code: int | str | None
    out: str
    err: str


def _call(argv) -> int | str | None:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors (and --help)
        return e.code
    except Exception:  # what `attnlab ...` would print: a traceback, exit code 1
        traceback.print_exc()
        return 1


def cli(capsys, *argv) -> Result:
    """Run ``attnlab *argv``; stdout and stderr from pytest's capsys."""
    capsys.readouterr()  # drop whatever came before
    code = _call(argv)
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def cli_captured(*argv) -> Result:
    """The same without capsys (for session-scoped fixtures): sys.stdout/stderr redirected."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _call(argv)
    return Result(code, out.getvalue(), err.getvalue())


@dataclass
class Completed:
    """What the tests read of a ``subprocess.CompletedProcess``."""

    returncode: int | str | None
    stdout: str
    stderr: str


def run(*argv, env: dict[str, str] | None = None, timeout: float = 300) -> Completed:
    """``attnlab *argv`` as a user runs it. Without ``env``, in this process: the same
    ``main``, exit code and output, without a new interpreter importing torch (seconds a call).
    With ``env`` (an injected fault, a signal to catch, a launcher's variables), in a process
    of its own, bounded by ``timeout``."""
    if env is None:
        r = cli_captured(*argv)
        return Completed(r.code, r.out, r.err)
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    return Completed(done.returncode, done.stdout, done.stderr)


def assert_bad_input(r: Result, *names: str, while_running: bool = False) -> str:
    """Exit code 2 and exactly one line on stderr, ``attnlab ...``, naming each of ``names``
    (a flag, a file); never a traceback. Returns that line. ``while_running``: the input is
    found bad only while the model runs, so the line saying what runs may come first."""
    assert "Traceback" not in r.err, f"a traceback instead of a one-line error:\n{r.err}"
    assert r.code == 2, f"exit code {r.code!r}, expected 2; stderr: {r.err!r}"
    lines = r.err.strip().splitlines()
    if while_running and lines and RUNNING.match(lines[0]):
        lines = lines[1:]
    assert len(lines) == 1, f"stderr is {len(lines)} lines, expected one: {r.err!r}"
    assert lines[0].startswith("attnlab"), lines[0]
    for name in names:
        assert name in lines[0], f"{name!r} is not named in {lines[0]!r}"
    return lines[0]


def tiny_bert(corpus: Path, out: Path, vocab_size: int, max_len: int) -> Path:
    """A random bert-tiny (torch seed 0) with a WordPiece vocabulary of ``vocab_size`` learnt
    from the text file ``corpus``, written to ``out`` as a Hugging Face folder."""
    tok = WordPieceTokenizer.train([corpus], vocab_size=vocab_size)
    torch.manual_seed(0)
    save_pretrained(BERT(ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size,
                                                 max_len=max_len)), out)
    tok.backend.save(str(Path(out) / "tokenizer.json"))
    return Path(out)


def not_a_folder(tmp_path):
    """A path whose parent is a regular file, so nothing can be created there."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    return blocker / "out"
