"""``--time-budget``: the run times its first steps, plans the steps that fit, and its schedule
ends there (attnlab.training.schedule.BudgetPlan, applied by the trainer every command uses).

The trainer reads its clock once when training starts and once after each step; the tests give
it a clock that advances 0.5 s a reading, so every step takes 0.5 s and the plan is known by
hand: a budget of 10.2 s fits 20 steps.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from attnlab.storage import list_checkpoints
from attnlab.training.schedule import (
    BudgetPlan,
    ConstantSchedule,
    CosineSchedule,
    NoamSchedule,
    PolynomialSchedule,
    replanned,
    schedule_from_dict,
)
from attnlab.training.trainer import Trainer
from tests.cli.helpers import cli


def test_the_plan_leaves_the_first_step_out_and_times_the_next():
    """The first step takes 3 s (a compilation, say), the others 0.5 s; budget 20 s. Timing
    stops once a tenth of the budget (2 s) is spent after the first step: at step 5 (4 steps,
    2 s), 5.0 s in. The 15 s left fit 30 steps more: 35."""
    plan = BudgetPlan(budget=20.0, asked=1000)
    times = {1: 3.0, **{k: 3.0 + 0.5 * (k - 1) for k in range(2, 10)}}
    found = {k: plan.observe(k, t) for k, t in times.items()}
    assert found == {1: None, 2: None, 3: None, 4: None, 5: 35, 6: None, 7: None, 8: None,
                     9: None}
    assert plan.seconds_per_step == 0.5 and plan.planned == 35
    assert plan.line() == ("--time-budget 20 s: 0.5 s a step; the schedule is planned for 35 "
                           "of the 1,000 steps")


def test_a_run_that_fits_keeps_its_steps():
    plan = BudgetPlan(budget=100.0, asked=12)
    planned = [plan.observe(k, 0.5 * k) for k in range(1, 13)]
    # timed over steps 2..11 (MEASURE = 10 of them): known at step 11, said once
    assert planned == [None] * 10 + [12, None]
    plan = BudgetPlan(budget=100.0, asked=3)
    assert [plan.observe(k, 0.5 * k) for k in (1, 2, 3)] == [None, None, 3]
    assert "all 3 steps fit (about 2 s)" in plan.line()


def test_a_replanned_schedule_keeps_its_shape():
    """Warmup keeps its share of the run; the decay ends at the planned step."""
    assert replanned(CosineSchedule(1e-3, 100, 2000, 1e-4), 1000) == \
        CosineSchedule(1e-3, 50, 1000, 1e-4)
    assert replanned(PolynomialSchedule(1e-3, 30, 90, 1e-5, 2.0), 20) == \
        PolynomialSchedule(1e-3, 7, 20, 1e-5, 2.0)
    for unchanged in (NoamSchedule(64, 400), ConstantSchedule(1e-3, 10)):
        assert replanned(unchanged, 20) == unchanged


def _fake_clock(monkeypatch, seconds: float = 0.5) -> None:
    ticks = itertools.count()
    monkeypatch.setattr(Trainer, "clock", staticmethod(lambda: next(ticks) * seconds))


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_lm_plans_its_cosine_schedule_for_the_steps_that_fit(capsys, monkeypatch,
                                                                   tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 40)
    _fake_clock(monkeypatch)
    run = tmp_path / "run"
    r = cli(capsys, "train", "lm", "--text", text, "--preset", "gpt-mini", "--set",
            "d_model=16", "--set", "n_heads=2", "--set", "n_decoder_layers=1", "--block", "8",
            "--batch", "2", "--steps", "100", "--warmup", "4", "--time-budget", "10.2",
            "--out", run, "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert ("--time-budget 10.2 s: 0.5 s a step; the schedule is planned for 20 of the 100 "
            "steps") in r.out
    rows = _rows(run)
    assert [row["step"] for row in rows] == list(range(1, 21))
    assert "val_loss" in rows[-1]  # the last step is the planned one: validated there
    state = torch.load(list_checkpoints(run / "checkpoints")[-1] / "trainer_state.pt",
                       weights_only=True)
    assert state["step"] == 20 and state["schedule"]["total_steps"] == 20
    schedule = schedule_from_dict(state["schedule"])
    assert isinstance(schedule, CosineSchedule) and schedule.warmup == 1  # 4 of 100: 1 of 20
    assert rows[-1]["lr"] == schedule(20)  # the steps took the planned schedule's rates
    unplanned = CosineSchedule(1e-3, 4, 100, 1e-4)
    assert rows[-1]["lr"] < 1.1e-4 < unplanned(20)  # decayed to about min_lr at its end
    last = r.out.strip().splitlines()
    assert last[-2] == ("--time-budget 10.2 s: the run and its schedule were planned for 20 "
                        "of the 100 steps asked for")
    assert last[-1] == f"try: attnlab generate --model {run} --prompt 'to be or not' " \
                       "--max-new-tokens 200"


def test_train_translate_stops_at_the_planned_step_with_noam(capsys, monkeypatch, tmp_path):
    """Noam has no length: the run stops at the planned step, its rates are Noam's."""
    _fake_clock(monkeypatch)
    run = tmp_path / "run"
    r = cli(capsys, "train", "translate", "--task", "numbers", "--n-train", "200", "--preset",
            "tiny", "--max-tokens", "256", "--steps", "100", "--time-budget", "10.2",
            "--no-evaluate", "--out", run, "--no-progress", "--device", "cpu", "--precision",
            "fp32")
    assert r.code == 0, r.err
    assert "the schedule is planned for 20 of the 100 steps" in r.out
    assert _rows(run)[-1]["step"] == 20
    last = r.out.strip().splitlines()
    assert "--time-budget 10.2 s" in last[-2] and "planned for 20" in last[-2]
    assert last[-1].startswith(f"try: attnlab translate --model {run} ")


@pytest.mark.parametrize("seconds, note", [
    (0.01, "--time-budget 10.2 s: the 30 steps asked for fit in it"),
    (0.5, "planned for 20 of the 30 steps asked for"),
])
def test_the_note_says_whether_the_steps_fit(capsys, monkeypatch, tmp_path, seconds, note):
    text = tmp_path / "text.txt"
    text.write_text("abcdefgh " * 100)
    _fake_clock(monkeypatch, seconds)
    r = cli(capsys, "train", "lm", "--text", text, "--preset", "gpt-mini", "--set",
            "d_model=16", "--set", "n_heads=2", "--set", "n_decoder_layers=1", "--block", "8",
            "--batch", "2", "--steps", "30", "--time-budget", "10.2", "--out",
            tmp_path / "run", "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert note in r.out.strip().splitlines()[-2]
