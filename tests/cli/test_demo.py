"""``attnlab demo``: bad input.

Covered elsewhere, not repeated here: the happy path, tests/test_demo.py::
test_short_demo_writes_checkpoint_curve_and_heatmap (a time-budgeted demo writes its
checkpoint, loss curve, heatmap and metrics), and short demos in
tests/training/test_evaluate.py and tests/explain/test_pictures.py.
"""

from tests.cli.helpers import assert_bad_input, cli, not_a_folder


def test_out_that_cannot_be_created_is_named(capsys, tmp_path):
    out = not_a_folder(tmp_path)
    r = cli(capsys, "demo", "--out", out, "--steps", "2", "--n-train", "50", "--n-test", "2",
            "--device", "cpu", "--precision", "fp32")
    assert_bad_input(r, str(out.parent))


def test_negative_steps_are_named(capsys, tmp_path):
    r = cli(capsys, "demo", "--out", tmp_path / "run", "--steps", "-3", "--n-train", "50",
            "--n-test", "2", "--device", "cpu", "--precision", "fp32")
    assert_bad_input(r, "steps", "-3")
