"""``attnlab plot schedule --schedule S``: the PNG is written, and the line it draws is the
rate of each step as transformers' schedulers give it (Noam: the paper's formula by hand)."""

from __future__ import annotations

import math

import pytest

from attnlab import viz
from tests.cli.helpers import assert_bad_input, cli
from tests.training.test_schedule_loss import _transformers_rates


def _plot(capsys, monkeypatch, out, *flags) -> list[float]:
    """Run ``plot schedule FLAGS``; the y values of the line drawn."""
    drawn = []
    figure = viz.figure_schedule

    def recording(schedule, steps, title=None):
        fig = figure(schedule, steps, title)
        drawn.extend(float(y) for y in fig.axes[0].lines[0].get_ydata())
        return fig

    monkeypatch.setattr(viz, "figure_schedule", recording)
    r = cli(capsys, "plot", "schedule", *flags, "--out", out)
    assert r.code == 0, r.err
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    return drawn


@pytest.mark.parametrize("kind, flags, reference", [
    ("cosine", [], {}),
    ("cosine", ["--min-lr", "2e-4"], {"min_lr": 2e-4}),
    ("linear", [], {}),
    ("polynomial", ["--lr-end", "1e-5", "--power", "3"], {"lr_end": 1e-5, "power": 3.0}),
    ("constant", [], {}),
], ids=["cosine", "cosine-min-lr", "linear", "polynomial", "constant"])
def test_each_schedule_draws_transformers_rates(capsys, monkeypatch, tmp_path, kind, flags,
                                                reference):
    drawn = _plot(capsys, monkeypatch, tmp_path / "s.png", "--schedule", kind, "--warmup",
                  "6", "--steps", "40", "--lr", "1e-3", *flags)
    theirs = _transformers_rates("cosine_min" if "min_lr" in reference else kind, 1e-3, 6,
                                 40, **reference)
    assert len(drawn) == 40
    for k, (a, b) in enumerate(zip(drawn, theirs, strict=True), start=1):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18), (k, a, b)


def test_noam_draws_the_formula_and_peaks_at_lr(capsys, monkeypatch, tmp_path):
    drawn = _plot(capsys, monkeypatch, tmp_path / "n.png", "--warmup", "50", "--steps", "200",
                  "--d-model", "64")
    assert drawn == [64**-0.5 * min(s**-0.5, s * 50**-1.5) for s in range(1, 201)]
    drawn = _plot(capsys, monkeypatch, tmp_path / "p.png", "--warmup", "50", "--steps", "200",
                  "--d-model", "64", "--lr", "2e-3")
    assert max(drawn) == drawn[49] and math.isclose(drawn[49], 2e-3, rel_tol=1e-12)


@pytest.mark.parametrize("flags, named", [
    (["--schedule", "triangle"], "triangle"),
    (["--schedule", "linear", "--min-lr", "1e-5"], "--min-lr"),
    (["--schedule", "cosine", "--power", "2"], "--power"),
    (["--schedule", "cosine", "--factor", "2"], "--factor"),
    (["--schedule", "polynomial", "--lr", "1e-4", "--lr-end", "1e-3"], "lr_end"),
    (["--schedule", "cosine", "--steps", "0"], "--steps"),
])
def test_a_bad_schedule_is_one_line(capsys, tmp_path, flags, named):
    r = cli(capsys, "plot", "schedule", *flags, "--out", tmp_path / "x.png")
    assert_bad_input(r, named)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", [
    ["train", "lm", "--text", "t.txt"], ["train", "translate", "--task", "numbers"],
    ["train", "classify", "--data", "d.jsonl", "--text-field", "t", "--label-field", "l"],
    ["train", "image", "--data", "digits"],
    ["train", "distill", "--teacher", "runs/x", "--student-layers", "1"],
])
def test_every_trainer_refuses_an_unknown_schedule_in_one_line(capsys, tmp_path, command):
    r = cli(capsys, *command, "--schedule", "triangle", "--out", tmp_path / "run")
    assert_bad_input(r, "--schedule", "triangle")
