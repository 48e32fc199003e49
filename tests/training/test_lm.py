"""Language-model training and generation through the CLI, on text generated here."""

import json
import signal

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.data.numbers import english
from attnlab.training.trainer import TrainConfig, build_optimizer
from tests.cli.helpers import run as run_attnlab
from tests.criteria import train_until

# After 100 warmup steps a constant learning rate (--min-lr = --lr): the schedule does not
# depend on --steps, so a run trained on in rounds (--resume) is the run trained in one go.
TRAIN = ["train", "lm", "--min-lr", "1e-3", "--eval-every", "50", "--save-every", "50",
         "--no-progress"]
ROUND, CAP = 50, 300  # steps a round; the most steps the run may take to learn
LEARNED = 0.8  # validation loss, nats a character; uniform over 27 characters: log 27 = 3.3


def cli(*args, env=None):
    """In this process, or, to inject a fault (``env``), in its own (tests/cli/helpers.run)."""
    return run_attnlab(*args, env=env)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "numbers.txt"
    path.write_text("".join(f"{english(n)}.\n" for n in range(3000)))
    return path


def metrics(folder):
    return [json.loads(r) for r in (folder / "metrics.jsonl").read_text().splitlines()]


def validation(folder):
    """The run's validation losses by step."""
    return {r["step"]: r["val_loss"] for r in metrics(folder) if "val_loss" in r}


@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    """A run trained in rounds of ROUND steps, each resumed from the last one's checkpoint,
    until its validation loss is below LEARNED, far below uniform (1.66, 0.98, 0.62 at steps
    50, 100, 150 natively): a model that writes lines of number words, as the generation
    tests below need."""
    out = tmp_path_factory.mktemp("lm")
    steps = 0

    def one_round():
        nonlocal steps
        steps += ROUND
        r = cli(*TRAIN, "--text", str(text), "--out", str(out), "--steps", str(steps),
                *(["--resume"] if steps > ROUND else []))
        assert r.returncode == 0, r.stderr

    def learned():
        step, loss = max(validation(out).items())
        return loss < LEARNED, f"validation loss {loss:.3f} at step {step}"

    train_until(one_round, learned, "train lm", every=1, cap=CAP // ROUND,
                unit=f"rounds of {ROUND} steps")
    return out


def test_lm_learns_and_reports_validation_loss(run):
    """A validation pass every 50 steps, the loss falling from the first to the last (the
    run's criterion, met: tests.criteria)."""
    val = validation(run)
    assert sorted(val) == list(range(ROUND, max(val) + 1, ROUND))
    assert val[ROUND] > val[max(val)]
    assert val[max(val)] < LEARNED < torch.log(torch.tensor(27.0)).item()  # far below uniform


def test_a_spent_time_budget_is_said(text, tmp_path):
    """The run plans the steps that fit in the budget (tests/training/test_budget.py) and ends
    at the planned step, or, when the budget runs out before it, at the first step after the
    budget; either way its last lines say what the budget did."""
    r = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path / "run"), "--steps", "100000",
            "--time-budget", "0.5", "--device", "cpu", "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    last = max(row["step"] for row in metrics(tmp_path / "run"))
    assert 1 <= last < 100000
    note = r.stdout.strip().splitlines()[-2]
    assert note.startswith("--time-budget 0.5 s") and (
        f"stopped at step {last:,} of " in note
        or f"planned for {last:,} of the 100,000 steps" in note), note


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
    r = cli(*TRAIN, "--steps", "1", "--text", str(text), "--out", str(tmp_path / "run"),
            *flags)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_train_lm_binary_file_is_named(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    r = cli(*TRAIN, "--steps", "1", "--text", str(binary), "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert r.stderr.strip() == (f"attnlab train: error: {binary}:2: not UTF-8 text "
                                "(byte 128: invalid start byte)")


def test_generate_bad_flags_and_empty_prompt(run):
    bad = cli("generate", "--model", str(run), "--prompt", "forty", "--top-p", "1.5")
    assert bad.returncode == 2 and bad.stdout == ""  # nothing printed before the error
    assert bad.stderr.strip() == "attnlab generate: error: --top-p must be in (0, 1], got 1.5"
    empty = cli("generate", "--model", str(run), "--prompt", "", "--max-new-tokens", "8")
    assert empty.returncode == 2 and empty.stdout == ""  # nothing to continue: one line
    assert empty.stderr.strip() == ("attnlab generate: error: --prompt is empty: give some text "
                                    "to continue, or --from-bos to start from the "
                                    "beginning-of-sequence token alone")
    bos = cli("generate", "--model", str(run), "--prompt", "", "--from-bos",
              "--max-new-tokens", "8", "--ignore-eos")
    assert bos.returncode == 0, bos.stderr  # starts from the beginning-of-sequence token
    assert len(bos.stdout.rstrip("\n")) > 0


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
    """Killed at step 70 and resumed, a run takes the steps ``run`` took (in rounds) with the
    same loss at every step."""
    steps = str(max(validation(run)))
    killed = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path), "--steps", steps,
                 env={"ATTNLAB_FAULT": "kill@step:70"})
    assert killed.returncode == -signal.SIGKILL
    r = cli(*TRAIN, "--text", str(text), "--out", str(tmp_path), "--steps", steps, "--resume")
    assert r.returncode == 0, r.stderr
    assert [row["loss"] for row in metrics(tmp_path)] == [row["loss"] for row in metrics(run)]


def test_weight_decay_applies_to_matrices_only():
    model = GPT(ModelConfig.from_preset("gpt-mini"))
    opt = build_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1), 1e-3)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() == 1 for p in plain["params"]) and plain["params"]
