"""Interruption, distributed equivalence and bad input, run as a user runs them: the CLI in a
subprocess where a fault is injected or several processes run, in this process otherwise (the
same ``main``, without a new interpreter's start-up). Runs are tiny (the numbers task, a few
steps) but exercise the real code paths."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.storage import load_model_dir
from attnlab.training import CheckpointError, average_checkpoints, list_checkpoints
from tests.cli.helpers import RUNNING, run

TRAIN = ["train", "translate", "--task", "numbers", "--n-train", "3000", "--preset", "tiny",
         "--max-tokens", "600", "--warmup", "50", "--no-progress", "--no-evaluate"]


def cli(*args, env=None, timeout=300):
    """In this process, or, to inject a fault (``env``), in its own (tests/cli/helpers.run)."""
    return run(*args, env=env, timeout=timeout)


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """12 uninterrupted steps, checkpoint every 4 (dropout on: RNG state must resume too)."""
    out = tmp_path_factory.mktemp("ref")
    r = cli(*TRAIN, "--steps", "12", "--save-every", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_sigkill_midway_then_resume_gives_identical_losses(reference_run, tmp_path):
    r = cli(*TRAIN, "--steps", "12", "--save-every", "4", "--out", str(tmp_path),
            env={"ATTNLAB_FAULT": "kill@step:6"})
    assert r.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step-00000004"]
    r = cli(*TRAIN, "--steps", "12", "--save-every", "4", "--out", str(tmp_path), "--resume")
    assert r.returncode == 0, r.stderr
    assert "resumed from step 4" in r.stdout
    expected, got = losses(reference_run), losses(tmp_path)
    assert sorted(got) == list(range(1, 13))
    assert got == expected  # bitwise: float reprs equal for every step
    a = load_file(str(reference_run / "checkpoints" / "step-00000012" / "model.safetensors"))
    b = load_file(str(tmp_path / "checkpoints" / "step-00000012" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(tmp_path):
    r = cli(*TRAIN, "--steps", "12", "--save-every", "4", "--out", str(tmp_path),
            env={"ATTNLAB_FAULT": "kill@checkpoint:8"})
    assert r.returncode == -signal.SIGKILL
    ckpts = list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in ckpts] == ["step-00000004"]  # the half-written one is not listed
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert any(name.startswith(".tmp-step-00000008") for name in leftovers)
    model, config, toks = load_model_dir(tmp_path)
    assert config.d_model == 64 and toks["target"].vocab_size > 4
    r = cli(*TRAIN, "--steps", "12", "--save-every", "4", "--out", str(tmp_path), "--resume")
    assert r.returncode == 0 and "resumed from step 4" in r.stdout


@pytest.mark.multiprocess
def test_ddp_two_processes_equal_one_process(tmp_path):
    # No biases: a key-projection bias has an exactly zero gradient (it adds the same q·b_k to
    # every score of a query, which softmax ignores), so Adam would turn float rounding noise
    # there into ±lr updates that differ between any two summation orders, DDP or not.
    # fp32: the equality is one of float32 sums in another order; bf16 autocast (what auto
    # picks on a CPU with native bf16) rounds each order differently by ~4e-3.
    common = [*TRAIN, "--steps", "4", "--save-every", "100", "--set", "dropout=0.0",
              "--set", "bias=false", "--precision", "fp32"]
    one = cli(*common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "attnlab.cli"]
    two = subprocess.run([*torchrun, *common, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr[-2000:]
    # the held-out numbers validate at the last step: one line, from rank 0 only
    assert one.stdout.count("step 4: val loss") == two.stdout.count("step 4: val loss") == 1
    a = load_file(str(tmp_path / "one/checkpoints/step-00000004/model.safetensors"))
    b = load_file(str(tmp_path / "two/checkpoints/step-00000004/model.safetensors"))
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-6, diff
    assert any((a[k] != 0).any() for k in a)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    r = cli(*TRAIN, "--steps", "20", "--save-every", "1", "--lr-factor", "1e12", "--out",
            str(tmp_path))
    assert r.returncode == 2
    assert "loss became" in r.stderr and "last good checkpoint" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    kept = list_checkpoints(tmp_path / "checkpoints")
    assert kept and str(kept[-1]) in r.stderr
    load_model_dir(kept[-1])  # loadable


@pytest.fixture(scope="module")
def trained(reference_run):
    return reference_run


@pytest.mark.parametrize("case", ["missing", "mismatch", "empty", "preset", "corrupt",
                                  "truncated", "too-long"])
def test_bad_input_one_line_exit_2(case, tmp_path, trained):
    (tmp_path / "a").write_text("a\nb\nc\n")
    (tmp_path / "b").write_text("x\ny\n")
    (tmp_path / "e").write_text("\n")
    base = ["train", "translate", "--steps", "1", "--out", str(tmp_path / "run")]
    model = tmp_path / "model"
    shutil.copytree(list_checkpoints(trained / "checkpoints")[-1], model)
    weights = model / "model.safetensors"
    if case == "missing":
        r = cli(*base, "--src", str(tmp_path / "nope"), "--tgt", str(tmp_path / "b"))
        expect = "nope"
    elif case == "mismatch":
        r = cli(*base, "--src", str(tmp_path / "a"), "--tgt", str(tmp_path / "b"))
        expect = "has 3 lines but"
    elif case == "empty":
        r, expect = cli(*base, "--src", str(tmp_path / "e"), "--tgt", str(tmp_path / "e")), "empty"
    elif case == "preset":
        r, expect = cli(*base, "--task", "numbers", "--preset", "giant"), "unknown preset 'giant'"
    elif case == "corrupt":
        data = bytearray(weights.read_bytes())
        data[:8] = b"\xff" * 8
        weights.write_bytes(bytes(data))
        r, expect = cli("translate", "--model", str(model), "one"), str(weights)
    elif case == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        r, expect = cli("translate", "--model", str(model), "one"), str(weights)
    else:
        r, expect = cli("translate", "--model", str(model), "one " * 300), "exceeds the model's"
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expect in r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if not RUNNING.match(line)]
    assert len(lines) == 1 and "Traceback" not in r.stderr


def test_fresh_run_into_a_folder_with_checkpoints_is_refused(trained):
    r = cli(*TRAIN, "--steps", "12", "--out", str(trained))
    assert r.returncode == 2 and "already holds checkpoints: pass --resume" in r.stderr
    assert len(losses(trained)) == 12  # nothing touched


def test_translate_from_stdin_and_checkpoint_averaging(trained):
    r = subprocess.run([sys.executable, "-m", "attnlab.cli", "translate", "--model",
                        str(trained)], input="one\ntwo\n", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    ckpts = list_checkpoints(trained / "checkpoints")
    avg = average_checkpoints(ckpts[-2:])
    a, b = (load_file(str(c / "model.safetensors")) for c in ckpts[-2:])
    for k in avg:
        assert torch.allclose(avg[k], (a[k] + b[k]) / 2, atol=1e-7)
    with pytest.raises(CheckpointError):
        average_checkpoints([Path("/nonexistent")])


def test_average_command_writes_a_loadable_model_folder(trained, tmp_path):
    r = cli("average", "--model", str(trained), "--last", "2", "--out", str(tmp_path / "avg"))
    assert r.returncode == 0, r.stderr
    ckpts = list_checkpoints(trained / "checkpoints")
    assert ckpts[-2].name in r.stdout and ckpts[-1].name in r.stdout
    model, _, _ = load_model_dir(tmp_path / "avg")
    expected = average_checkpoints(ckpts[-2:])
    state = model.state_dict()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert model.lm_head.weight is model.tgt_embed.weight  # still tied after loading
    r = cli("translate", "--model", str(tmp_path / "avg"), "one")
    assert r.returncode == 0 and r.stdout.strip()
