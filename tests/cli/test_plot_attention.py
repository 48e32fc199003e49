"""``attnlab plot attention SENTENCE``: the grid of every layer and head, one layer's heads
(``--layer``), or one head's labelled map (``--layer --head``), each holding the model's own
weights; a layer or head the model lacks is one line."""

from __future__ import annotations

import pytest
import torch
from matplotlib.image import imread

from tests.cli.helpers import assert_bad_input, cli

SENTENCE = "the cat sat on the mat"


@pytest.mark.parametrize("flags", [[], ["--layer", "1"], ["--layer", "1", "--head", "2"]],
                         ids=["grid", "layer", "head"])
def test_plot_attention_writes_the_map_asked_for(capsys, tmp_path, flags):
    out = tmp_path / "map.png"
    r = cli(capsys, "plot", "attention", SENTENCE, "--out", str(out), "--quiet", *flags)
    assert r.code == 0, r.err
    assert r.out.strip() == f"wrote {out}"
    height, width = imread(str(out)).shape[:2]
    assert height > 100 and width > 100


def test_one_heads_map_shows_the_models_own_weights(tmp_path, monkeypatch, capsys):
    """The figure's image is the model's layer 1, head 2 (the tiny model of --seed 0)."""
    from attnlab import viz
    from attnlab.explain.subject import load_subject_model, make_subject

    drawn = {}
    monkeypatch.setattr(viz, "plot_attention_head",
                        lambda w, tokens, path, title: drawn.update(w=w, tokens=tokens))
    r = cli(capsys, "plot", "attention", SENTENCE, "--layer", "1", "--head", "2", "--out",
            str(tmp_path / "x.png"), "--quiet")
    assert r.code == 0, r.err
    m = load_subject_model(None, [SENTENCE], 0)
    subject = make_subject(m.model, m.tokenizer, SENTENCE, m.label)
    own = subject.run_model().weights[1][2]
    assert drawn["tokens"] == subject.tokens
    torch.testing.assert_close(drawn["w"], own)


@pytest.mark.parametrize("flags, names", [
    (["--layer", "7"], ["--layer 7", "0..1"]),
    (["--layer", "0", "--head", "9"], ["--head 9", "0..3"]),
    (["--head", "1"], ["--head", "--layer"]),
])
def test_a_layer_or_head_the_model_lacks_is_one_line(capsys, tmp_path, flags, names):
    r = cli(capsys, "plot", "attention", SENTENCE, "--out", str(tmp_path / "x.png"),
            "--quiet", *flags)
    assert_bad_input(r, *names)


def test_layer_and_head_are_for_a_sentences_attention(capsys, tmp_path):
    r = cli(capsys, "plot", "positional", "--out", str(tmp_path / "x.png"), "--layer", "0")
    assert_bad_input(r, "--layer")
