"""``attnlab explain`` and ``plot``.

Covered elsewhere, not repeated here:

- explain: happy path tests/explain/test_walkthrough.py::test_explain_cli_tiny_and_backward
  (all checks pass, ``--compare``, ``--backward``); bad input ::test_bad_layer_is_named
  (``--layer 9``: exit code and message only).
- plot: happy path tests/explain/test_pictures.py::test_plots_are_written_and_not_blank
  (attention, positional, schedule: real, non-blank images) and
  ::test_cross_attention_plot_from_a_checkpoint.

Here: bad input for both, with the whole one-line contract.
"""

from tests.cli.helpers import assert_bad_input, cli, not_a_folder


def test_explain_without_a_sentence_says_what_to_give(capsys):
    r = cli(capsys, "explain")
    assert_bad_input(r, "sentence", "--backward")
    assert r.out == ""


def test_explain_html_that_cannot_be_written_is_named(capsys, tmp_path):
    page = not_a_folder(tmp_path).with_suffix(".html")
    r = cli(capsys, "explain", "the cat sat", "--html", page)
    assert_bad_input(r, str(page.parent))


def test_plot_cross_needs_a_model(capsys, tmp_path):
    r = cli(capsys, "plot", "cross", "forty-two", "--out", tmp_path / "cross.png")
    assert_bad_input(r, "--model")
    assert not (tmp_path / "cross.png").exists()


def test_plot_cross_of_an_encoder_is_refused(capsys, tmp_path, mlm_run):
    r = cli(capsys, "plot", "cross", "alpha", "--model", mlm_run.path, "--out",
            tmp_path / "cross.png")
    assert_bad_input(r, str(mlm_run.path), "encoder")
    assert not (tmp_path / "cross.png").exists()


def test_plot_out_that_cannot_be_written_is_named(capsys, tmp_path):
    out = not_a_folder(tmp_path).with_suffix(".png")
    r = cli(capsys, "plot", "positional", "--d-model", "16", "--max-len", "10", "--out", out)
    assert_bad_input(r, str(out.parent))
