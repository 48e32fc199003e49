"""``attnlab explain`` and ``plot``.

Covered elsewhere, not repeated here:

- explain: happy path tests/explain/test_walkthrough.py::test_explain_cli_tiny_and_backward
  (all checks pass, ``--compare``, ``--backward``); bad input ::test_bad_layer_is_named
  (``--layer 9``: exit code and message only).
- plot: happy path tests/explain/test_pictures.py::test_plots_are_written_and_not_blank
  (attention, positional, schedule: real, non-blank images) and
  ::test_cross_attention_plot_from_a_checkpoint; the layout of every figure of attnlab.viz,
  on long inputs, tests/test_viz.py.

Here: bad input for both, with the whole one-line contract (no sentence is made up, input a
command would ignore is refused); the line naming the model, device, precision and threads
(and ``--quiet``); the text of each ``plot`` kind inside its picture.
"""

import pytest
import torch

from attnlab import viz
from attnlab.storage import resolve_model_dir
from tests.cli.helpers import assert_bad_input, cli, not_a_folder
from tests.test_viz import assert_text_fits


def test_explain_without_a_sentence_says_what_to_give(capsys):
    r = cli(capsys, "explain")
    assert_bad_input(r, "sentence", "--backward")
    assert r.out == ""


@pytest.mark.parametrize("extra, named", [
    (["the cat sat"], ["sentence"]),
    (["--model", "minilm", "--compare", "a dog"], ["--model", "--compare"]),
])
def test_explain_backward_refuses_what_it_would_ignore(capsys, extra, named):
    r = cli(capsys, "explain", "--backward", *extra)
    assert_bad_input(r, "--backward", *named)
    assert r.out == ""


def test_explain_word_without_compare_is_refused(capsys):
    r = cli(capsys, "explain", "the cat sat", "--word", "cat")
    assert_bad_input(r, "--word", "--compare")
    assert r.out == ""


def test_explain_html_that_cannot_be_written_is_named(capsys, tmp_path):
    page = not_a_folder(tmp_path).with_suffix(".html")
    r = cli(capsys, "explain", "the cat sat", "--html", page)
    assert_bad_input(r, "--html", str(page.parent))
    assert r.out == "" and len(r.err.splitlines()) == 1  # refused before a model is announced


@pytest.mark.parametrize("kind", ["attention", "cross"])
def test_plot_without_a_sentence_is_refused(capsys, tmp_path, kind):
    """Issue #26: no "the cat sat on the mat" through a random model nobody asked for."""
    r = cli(capsys, "plot", kind, "--out", tmp_path / "x.png")
    assert_bad_input(r, f"plot {kind}", "sentence")
    assert r.out == "" and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("kind, extra, named", [
    ("positional", ["the cat sat"], "sentence"),
    ("schedule", ["--model", "minilm"], "--model"),
])
def test_plot_without_a_model_refuses_a_sentence_or_model(capsys, tmp_path, kind, extra, named):
    r = cli(capsys, "plot", kind, *extra, "--out", tmp_path / "x.png")
    assert_bad_input(r, f"plot {kind}", named)
    assert not (tmp_path / "x.png").exists()


def test_plot_cross_needs_a_model(capsys, tmp_path):
    r = cli(capsys, "plot", "cross", "forty-two", "--out", tmp_path / "cross.png")
    assert_bad_input(r, "--model")
    assert not (tmp_path / "cross.png").exists()


def test_plot_cross_of_an_encoder_is_refused(capsys, tmp_path, mlm_run):
    r = cli(capsys, "plot", "cross", "alpha", "--model", mlm_run.path, "--out",
            tmp_path / "cross.png")
    assert_bad_input(r, str(mlm_run.path), "encoder")
    assert not (tmp_path / "cross.png").exists()


@pytest.mark.parametrize("kind", ["positional", "attention"])
def test_plot_out_that_cannot_be_written_is_named(capsys, tmp_path, kind):
    out = not_a_folder(tmp_path).with_suffix(".png")
    sentence = ["the cat sat"] if kind == "attention" else []
    r = cli(capsys, "plot", kind, *sentence, "--out", out)
    assert_bad_input(r, "--out", str(out.parent))
    assert len(r.err.splitlines()) == 1  # refused before a model is announced


# --- the line naming the model ---------------------------------------------------------------
def announced(err: str, command: str) -> str:
    """The one line on stderr, which names the command and the threads torch runs on."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr: {err!r}"
    assert lines[0].startswith(f"attnlab {command}: "), lines[0]
    assert f"{torch.get_num_threads()} threads" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["explain", "the cat sat on the mat", "--dims", "2"],
    ["plot", "attention", "the cat sat on the mat", "--seed", "3"],
], ids=["explain", "plot-attention"])
def test_a_random_model_is_announced_as_random(capsys, tmp_path, argv):
    out = ["--out", tmp_path / "grid.png"] if argv[0] == "plot" else []
    r = cli(capsys, *argv, *out)
    assert r.code == 0, r.err
    line = announced(r.err, argv[0])
    seed = argv[argv.index("--seed") + 1] if "--seed" in argv else "0"
    assert f"random tiny model (untrained, seed {seed}) on cpu, fp32," in line, line
    assert r.out and line not in r.out  # the output is on stdout, the line on stderr only

    quiet = cli(capsys, *argv, *out, "--quiet")
    assert quiet.code == 0 and quiet.err == "" and quiet.out == r.out


def test_plot_cross_announces_the_checkpoint_it_loaded(capsys, tmp_path, translation_run):
    png = tmp_path / "cross.png"
    r = cli(capsys, "plot", "cross", "forty-two", "--model", translation_run.path, "--out", png)
    assert r.code == 0, r.err
    line = announced(r.err, "plot")
    checkpoint = resolve_model_dir(translation_run.path)  # a run's checkpoint, not the run
    assert checkpoint != translation_run.path
    assert f" {checkpoint} on cpu, fp32," in line, line
    assert png.exists()


# --- the text of each picture inside it ------------------------------------------------------
@pytest.fixture
def figures(monkeypatch) -> list:
    """The figures ``attnlab plot`` saves, kept as they were written."""
    kept, save = [], viz._save

    def keep(fig, path):
        kept.append(fig)
        return save(fig, path)

    monkeypatch.setattr(viz, "_save", keep)
    return kept


@pytest.mark.parametrize("argv", [
    ["attention", "the quick brown fox jumps over the lazy dog while the cat sat on the mat "
                  "and nobody minded it at all"],  # 21 words and <eos>
    ["positional", "--d-model", "64", "--max-len", "50"],
    ["schedule", "--d-model", "512", "--warmup", "4000", "--steps", "2000"],
], ids=["attention-20-tokens", "positional", "schedule"])
def test_plot_kinds_keep_their_text_inside(capsys, tmp_path, figures, argv):
    r = cli(capsys, "plot", *argv, "--out", tmp_path / "x.png", "--quiet")
    assert r.code == 0, r.err
    assert len(figures) == 1
    assert_text_fits(figures[0])


def test_plot_cross_keeps_its_text_inside(capsys, tmp_path, figures, translation_run):
    r = cli(capsys, "plot", "cross", "forty-two", "--model", translation_run.path, "--out",
            tmp_path / "cross.png", "--quiet")
    assert r.code == 0, r.err
    texts = assert_text_fits(figures[0])
    assert "cross-attention, last layer (mean of heads)" in {t.get_text() for t in texts}
