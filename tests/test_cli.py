"""The command line: run as a user would (a subprocess), checking output and exit codes."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_info_prints_architecture_and_parameter_table():
    r = run("info", "--preset", "base")
    assert r.returncode == 0, r.stderr
    for field in ("d_model", "heads", "d_k", "d_ff", "dropout", "positional encoding",
                  "post-LN", "relu", "sinusoidal"):
        assert field in r.stdout
    assert "63,082,496" in r.stdout and "encoder layer (one)" in r.stdout
    assert "decoder stack" in r.stdout


@pytest.mark.parametrize("args", [["--help"], ["info", "--help"]])
def test_help(args):
    r = run(*args)
    assert r.returncode == 0 and "usage" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["info", "--preset", "nope"], "unknown preset 'nope'"),
    (["info", "--set", "d_model=30"], "d_model=30 is not divisible"),
    (["info", "--set", "nonsense"], "expected KEY=VALUE"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_info_for_decoder_only_presets():
    r = run("info", "--preset", "gpt2")
    assert r.returncode == 0, r.stderr
    assert "124,439,808" in r.stdout and "12 (causal)" in r.stdout and "gelu_tanh" in r.stdout
