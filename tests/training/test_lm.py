"""Language-model training and generation through the CLI, on text generated here."""

import json
import signal

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.data.numbers import english
from attnlab.training.trainer import TrainConfig, build_optimizer
from tests.cli.helpers import run as run_attnlab

TRAIN = ["train", "lm", "--steps", "150", "--eval-every", "50", "--no-progress"]


def cli(*args, env=None):
    """In this process, or, to inject a fault (``env``), in its own (tests/cli/helpers.run)."""
    return run_attnlab(*args, env=env)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "numbers.txt"
    path.write_text("".join(f"{english(n)}.\n" for n in range(3000)))
    return path


@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    r = cli(*TRAIN, "--text", str(text), "--out", str(out), "--save-every", "50")
    assert r.returncode == 0, r.stderr
    return out


def test_lm_learns_and_reports_validation_loss(run):
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 3  # steps 50, 100, 150
    # Measured 0.585 at step 150 both natively and with AVX2 emulated (and 1.66, 0.98 before):
    # the bound holds with a wide margin on any CPU's rounding.
    assert val[-1] < 1.0 < torch.log(torch.tensor(27.0)).item()  # far below uniform
    assert val[0] > val[-1]


def test_generate_streams_and_stops(run):
    r = cli("generate", "--model", str(run), "--prompt", "forty-", "--max-new-tokens", "40",
            "--stop", "\\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("forty-") and r.stdout.count("\n") == 1
    long = cli("generate", "--model", str(run), "--prompt", "a" * 300)
    assert long.returncode == 2
    assert "exceeds the model's context of 64 (trained with --block 64)" in long.stderr
    assert "Traceback" not in long.stderr
    cut = cli("generate", "--model", str(run), "--prompt", "a" * 300, "--truncate",
              "--max-new-tokens", "5")
    assert cut.returncode == 0, cut.stderr


@pytest.mark.parametrize("flags, message", [
    (["--block", "0"], "block and batch size must be >= 1, got block=0"),
    (["--lr", "-1"], "peak_lr must be > 0, got -1.0"),
    (["--set", "d_model=abc"], "config field d_model='abc': expected int"),
])
def test_train_lm_bad_settings_are_one_line_errors(text, tmp_path, flags, message):
    r = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path / "run"), *flags)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_train_lm_binary_file_is_named(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    r = cli(*TRAIN, "--text", str(binary), "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert r.stderr.strip() == (f"attnlab train: error: {binary}:2: not UTF-8 text "
                                "(byte 128: invalid start byte)")


def test_generate_bad_flags_and_empty_prompt(run):
    bad = cli("generate", "--model", str(run), "--prompt", "forty", "--top-p", "1.5")
    assert bad.returncode == 2 and bad.stdout == ""  # nothing printed before the error
    assert bad.stderr.strip() == "attnlab generate: error: --top-p must be in (0, 1], got 1.5"
    empty = cli("generate", "--model", str(run), "--prompt", "", "--max-new-tokens", "8",
                "--ignore-eos")
    assert empty.returncode == 0, empty.stderr  # starts from the beginning-of-sequence token
    assert len(empty.stdout.rstrip("\n")) > 0


def test_translation_commands_refuse_a_language_model(run):
    for args in (["translate", "--model", str(run), "hello"],
                 ["evaluate", "translate", "--model", str(run), "--src", "a", "--ref", "b"]):
        r = cli(*args)
        assert r.returncode == 2 and "arch='decoder' is not a translation model" in r.stderr
    r = cli("average", "--model", str(run), "--last", "0")
    assert r.returncode == 2 and "got 0" in r.stderr


def test_generate_int4_runs_a_trained_run(run):
    """``--int4`` quantises a trained run's matrices (the numerics: tests/nn/test_quantized)."""
    small = cli("generate", "--model", str(run), "--prompt", "three hundred and",
                "--max-new-tokens", "12", "--stop", "\\n", "--int4")
    assert small.returncode == 0, small.stderr
    assert small.stdout.startswith("three hundred and") and small.stdout.count("\n") == 1


def test_lm_resume_after_sigkill_is_exact(run, text, tmp_path):
    killed = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path), "--save-every", "50",
                 env={"ATTNLAB_FAULT": "kill@step:70"})
    assert killed.returncode == -signal.SIGKILL
    r = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path), "--save-every", "50",
            "--resume")
    assert r.returncode == 0, r.stderr

    def losses(folder):
        return [json.loads(x)["loss"] for x in (folder / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path) == losses(run)


def test_weight_decay_applies_to_matrices_only():
    model = GPT(ModelConfig.from_preset("gpt-mini"))
    opt = build_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1), 1e-3)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() == 1 for p in plain["params"]) and plain["params"]
