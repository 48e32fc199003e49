"""Runs shared by the command-line tests: each trained once a session, tiny and on the CPU."""

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.helpers import Result, cli_captured

CYCLE = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
MLM_LINES = 200
MLM_VOCAB = 60


@dataclass
class Run:
    path: Path
    result: Result  # what training printed


@pytest.fixture(scope="session")
def mlm_run(tmp_path_factory) -> Run:
    """``train mlm``: bert-tiny, 2 steps, on 200 lines of six words from a cycle of twelve."""
    folder = tmp_path_factory.mktemp("mlm")
    rng = random.Random(0)
    lines = [" ".join(CYCLE[(k + j) % len(CYCLE)] for j in range(6))
             for k in (rng.randrange(len(CYCLE)) for _ in range(MLM_LINES))]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")
    run = folder / "run"
    r = cli_captured("train", "mlm", "--text", folder / "corpus.txt", "--preset", "bert-tiny",
                     "--vocab-size", MLM_VOCAB, "--steps", "2", "--eval-every", "2", "--batch",
                     "8", "--max-len", "16", "--out", run, "--no-progress", "--device", "cpu",
                     "--precision", "fp32")
    assert r.code == 0, r.err
    return Run(run, r)


@pytest.fixture(scope="session")
def translation_run(tmp_path_factory) -> Run:
    """``train translate``: the numbers task, tiny preset, 2 steps, a checkpoint after each."""
    run = tmp_path_factory.mktemp("translate") / "run"
    r = cli_captured("train", "translate", "--task", "numbers", "--n-train", "200", "--steps",
                     "2", "--save-every", "1", "--preset", "tiny", "--max-tokens", "512",
                     "--out", run, "--no-progress", "--no-evaluate", "--device", "cpu",
                     "--precision", "fp32")
    assert r.code == 0, r.err
    return Run(run, r)


@pytest.fixture(scope="session")
def lm_run(tmp_path_factory) -> Path:
    """``train lm``: a character-level gpt-mini of one layer, 2 steps."""
    folder = tmp_path_factory.mktemp("lm")
    (folder / "text.txt").write_text("to be or not to be, that is the question. " * 40)
    r = cli_captured("train", "lm", "--text", folder / "text.txt", "--preset", "gpt-mini",
                     "--set", "d_model=32", "--set", "n_heads=2", "--set", "n_decoder_layers=1",
                     "--steps", "2", "--block", "16", "--batch", "4", "--out", folder / "run",
                     "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    return folder / "run"
