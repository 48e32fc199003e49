"""``attnlab train image --data digits``: a short run to a stated validation accuracy, the run
folder it leaves, and bad input.

The run stops by a criterion, not after a fixed number of steps: at the first validation pass
(every 50 steps) whose accuracy on the 144 validation digits is at least ``TARGET``; a run
that reaches its step cap first fails. The test split is scored only at the end, apart.
"""

import json
import re

import pytest
import torch

from attnlab import load
from attnlab.data.images import load_digits
from attnlab.training.objectives import ImageClassify, classification_metrics
from tests.cli.helpers import assert_bad_input, cli, cli_captured

TARGET = 0.9  # validation accuracy
CAP = 1500  # steps; the schedule's length too
# the default 2-minute budget lifted: only the criterion and the step cap end this run, however
# busy the machine is
FAST = ("--no-progress", "--device", "cpu", "--precision", "fp32", "--time-budget", "3600")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for this module (``hardware.use_threads`` keeps torch's count, at
    most the CPUs): the model's operations are small, so one thread is about as fast as two on
    an idle machine (19 against 15 ms a step), and it does not collapse when another process
    holds a core (a two-thread pool then waits on the descheduled thread at every operation:
    200 steps took 168 s instead of 5 s on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory, one_thread):
    run = tmp_path_factory.mktemp("image") / "run"
    r = cli_captured("train", "image", "--data", "digits", "--stop-at-accuracy", TARGET,
                     "--steps", CAP, "--eval-every", "50", "--out", run, *FAST)
    assert r.code == 0, r.err
    return run, r


def accuracy_line(out: str, split: str) -> float:
    return float(re.search(rf"^{split}: accuracy ([0-9.]+), macro-F1 [0-9.]+$", out,
                           re.M).group(1))


def test_short_digits_run_reaches_the_stated_validation_accuracy(digits_run):
    run, r = digits_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    passes = [row for row in rows if "val_accuracy" in row]
    print(f"stopped at step {rows[-1]['step']} after {rows[-1]['time']:.1f} s of training: "
          f"validation accuracy {passes[-1]['val_accuracy']:.4f}")
    assert passes[-1]["val_accuracy"] >= TARGET, (
        f"criterion not met after {CAP} steps (the cap): validation accuracy "
        f"{passes[-1]['val_accuracy']:.4f} < {TARGET}")
    assert all(p["val_accuracy"] < TARGET for p in passes[:-1])  # it stopped at the first
    assert rows[-1]["step"] == passes[-1]["step"] < CAP
    assert f">= {TARGET}: stopping" in r.out
    assert "1294 train, 144 validation, 359 test images of (1, 8, 8)" in r.out
    assert "device cpu, precision fp32, 1 threads" in r.out
    # final/ is the model that met the criterion; the test split is reported apart
    assert accuracy_line(r.out, "val") == pytest.approx(passes[-1]["val_accuracy"], abs=1e-4)
    assert 0.5 < accuracy_line(r.out, "test") <= 1
    assert f"model in {run / 'final'}" in r.out


def test_the_run_folder_loads_as_a_vision_model_without_tokenizer(digits_run):
    run, r = digits_run
    loaded = load(run)
    assert (loaded.kind, loaded.tokenizers, loaded.path) == ("vision", {}, run / "final")
    assert loaded.config.extra["labels"] == [str(d) for d in range(10)]
    test = load_digits().test
    with torch.no_grad():
        assert loaded.model(test.images[:5]).shape == (5, 10)
    got = classification_metrics(loaded.model, test.batches(64), torch.device("cpu"), 10,
                                 ImageClassify())
    assert got["accuracy"] == pytest.approx(accuracy_line(r.out, "test"), abs=1e-4)


@pytest.mark.parametrize("flags, named", [
    (["--data", "mnist"], ["--data 'mnist'", "digits"]),
    (["--data", "digits", "--preset", "tiny"], ["--preset tiny", "vit-tiny"]),
    (["--data", "digits", "--preset", "vit-base"], ["(1, 8, 8)", "(3, 224, 224)"]),
    (["--data", "digits", "--set", "image_size=4"], ["(1, 8, 8)", "(1, 4, 4)"]),
    (["--data", "digits", "--batch", "0"], ["--batch"]),
    (["--data", "digits", "--stop-at-accuracy", "2"], ["stop_at_accuracy"]),
])
def test_bad_input_is_one_line(capsys, tmp_path, flags, named):
    r = cli(capsys, "train", "image", *flags, "--out", tmp_path / "run", *FAST)
    assert_bad_input(r, *named)
    assert not (tmp_path / "run" / "checkpoints").exists()
