"""What a trainer does under faults: SIGTERM / SIGINT, a second trainer on the same folder, a
full disk. Each trainer is a real ``attnlab train lm`` process on the CPU in fp32."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.storage import list_checkpoints, load_model_dir
from tests.cli.helpers import run

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300))
STEPS = 30


def train_args(text: Path, out: Path, steps: int = STEPS, *extra: str) -> list[str]:
    return ["train", "lm", "--text", str(text), "--preset", "gpt-mini", "--set", "d_model=32",
            "--set", "n_heads=2", "--set", "n_decoder_layers=1", "--set", "dropout=0.1",
            "--block", "16", "--batch", "4", "--steps", str(steps), "--save-every", "10",
            "--eval-every", "10", "--out", str(out), "--no-progress", "--device", "cpu",
            "--precision", "fp32", *extra]


def run_cli(args: list[str], fault: str | None = None, **kwargs):
    """The CLI with a fault injected, in a process of its own; without one (and without
    subprocess options), in this process (tests/cli/helpers.run)."""
    if fault is None and not kwargs:
        return run(*args)
    env = {**os.environ, **({"ATTNLAB_FAULT": fault} if fault else {})}
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background (`make test &`)
    # hands its children SIGINT ignored, which the trainer rightly keeps ignored
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          **kwargs)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def uninterrupted(text, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("reference") / "run"
    r = run_cli(train_args(text, out))
    assert r.returncode == 0, r.stderr
    return (list_checkpoints(out / "checkpoints")[-1] / "model.safetensors").read_bytes()


@pytest.mark.parametrize("name, code", [("term", 143), ("int", 130)])
def test_a_signal_saves_the_step_and_resume_is_bitwise_the_same(text, uninterrupted, tmp_path,
                                                                name, code):
    """Dropout is on, so the RNG state must survive too; step 13 is between checkpoints."""
    out = tmp_path / "run"
    r = run_cli(train_args(text, out), fault=f"{name}@step:13")
    sig = "SIGTERM" if name == "term" else "SIGINT"
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [f"attnlab train: stopped: {sig} at step 13; checkpoint "
                     f"{out / 'checkpoints' / 'step-00000013'} (continue with --resume)"]
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1] == "step-00000013"
    resumed = run_cli(train_args(text, out, STEPS, "--resume"))
    assert resumed.returncode == 0 and "resumed from step 13" in resumed.stdout
    final = list_checkpoints(out / "checkpoints")[-1]
    assert final.name == f"step-{STEPS:08d}"
    assert (final / "model.safetensors").read_bytes() == uninterrupted


def test_a_second_signal_during_the_write_leaves_the_previous_checkpoint(text, tmp_path):
    out = tmp_path / "run"
    r = run_cli(train_args(text, out), fault="term@step:13,term@checkpoint:13")
    assert r.returncode == -signal.SIGTERM  # the second SIGTERM ended the process at once
    kept = list_checkpoints(out / "checkpoints")
    assert [p.name for p in kept] == ["step-00000010"]
    load_model_dir(kept[-1])  # complete and loadable
    resumed = run_cli(train_args(text, out, STEPS, "--resume"))
    assert resumed.returncode == 0 and "resumed from step 10" in resumed.stdout
    assert not list((out / "checkpoints").glob(".tmp-*"))  # the half-written one is gone


def test_one_trainer_per_run_folder(text, tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "attnlab.cli",
                              *train_args(text, out, 1_000_000)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "metrics.jsonl").exists():  # it holds the lock once it trains
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        second = run_cli(train_args(text, out, 5, "--resume"))
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"attnlab train: error: {out}: another trainer (PID {first.pid} on "
            f"{socket.gethostname()}) is using this run folder; wait for it to finish or choose "
            "another --out"]
    finally:
        first.kill()  # SIGKILL: no clean-up runs, the OS releases the lock
        first.wait(timeout=30)
    third = run_cli(train_args(text, out, 5, "--resume"))
    assert third.returncode == 0, third.stderr


@pytest.mark.parametrize("writer", ["weights", "trainer state"])
def test_a_full_disk_at_checkpoint_time(text, tmp_path, monkeypatch, capsys, writer):
    """The second checkpoint (step 20) hits a full disk while writing its weights (an OSError
    from safetensors) or its trainer state (torch.save reports it as a RuntimeError)."""
    import torch

    import attnlab.storage

    calls = []
    if writer == "weights":
        real = attnlab.storage.save_model

        def failing(model, filename, *args, **kwargs):
            calls.append(filename)
            if len(calls) == 2:
                Path(filename).write_bytes(b"partial")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
            return real(model, filename, *args, **kwargs)

        monkeypatch.setattr(attnlab.storage, "save_model", failing)
        reason = "No space left on device"
    else:
        real = torch.save

        def failing(obj, f, *args, **kwargs):
            calls.append(f)
            if len(calls) == 2:
                raise RuntimeError("[enforce fail at inline_container.cc:778] . "
                                   "PytorchStreamWriter "
                                   "failed writing file data/0: file write failed")
            return real(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", failing)
        reason = "PytorchStreamWriter failed writing file data/0: file write failed"
    out = tmp_path / "run"
    code = main(train_args(text, out))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"attnlab train: error: {out / 'checkpoints' / 'step-00000020'}: "
                             "could not be written (") and reason in err[0]
    assert err[0].endswith("training stopped at step 20, last good checkpoint: "
                           f"{out / 'checkpoints' / 'step-00000010'}")
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000010"]
    load_model_dir(out / "checkpoints" / "step-00000010")
