"""Every picture attnlab draws keeps its text inside the canvas, and a figure title clear of
the panel titles, for short and long inputs alike.

The criterion (:func:`assert_text_fits`) is measured on the figure as drawn by Agg: every Text
artist the draw renders (titles, tick labels, axis labels, colour-bar labels, legends) must lie
inside ``fig.bbox`` (1 px of slack), and no figure-level text (the suptitle) may intersect an
axes title. The inputs are the ones that broke it before: a title wider than a short heatmap
(cut off), many long source tokens under a two-row heatmap (labels below the canvas), the
MiniLM-shaped 6 x 12 grid (suptitle over the first row's titles).

The ``attnlab plot`` kinds are checked through the command line in tests/cli/test_explain.py.
"""

import json
from unittest import mock

import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Text

from attnlab import viz
from attnlab.training.schedule import NoamSchedule

SLACK = 1.0  # pixels
LONG = [f"▁internationalisation{i}" for i in range(20)]  # 20 long sentencepiece tokens
MINILM = "[CLS] the cat sat on the mat [SEP]".split()  # what minilm makes of the README's


def drawn_texts(fig: Figure) -> tuple[list[Text], object]:
    """``(texts, renderer)``: the Text artists that drawing ``fig`` on its canvas renders (the
    visible, non-empty ones; tick labels outside the view are not drawn), and the renderer."""
    drawn = []
    draw = Text.draw

    def recording(self, renderer):
        if self.get_visible() and self.get_text():
            drawn.append(self)
        return draw(self, renderer)

    with mock.patch.object(Text, "draw", recording):
        fig.canvas.draw()
    return drawn, fig.canvas.get_renderer()


def assert_text_fits(fig: Figure) -> list[Text]:
    """Every drawn text inside the figure's canvas, no figure-level text (suptitle) over an
    axes title. Returns the drawn texts."""
    texts, renderer = drawn_texts(fig)
    assert texts, "nothing was drawn"
    box = fig.bbox
    outside = []
    for text in texts:
        e = text.get_window_extent(renderer)
        if (e.x0 < box.x0 - SLACK or e.y0 < box.y0 - SLACK or e.x1 > box.x1 + SLACK
                or e.y1 > box.y1 + SLACK):
            outside.append(f"{text.get_text()!r} at {[round(v) for v in e.extents]}")
    assert not outside, (f"{len(outside)} text(s) outside the canvas "
                         f"{[round(v) for v in box.extents]}: {outside[:5]}")
    titles = [ax.title for ax in fig.axes if ax.title.get_text()]
    for top in fig.texts:
        above = top.get_window_extent(renderer)
        hit = [t.get_text() for t in titles if above.overlaps(t.get_window_extent(renderer))]
        assert not hit, f"{top.get_text()!r} overlaps the axes title(s) {hit[:5]}"
    return texts


def shown(texts: list[Text]) -> set[str]:
    return {t.get_text() for t in texts}


def test_the_criterion_fails_on_a_cut_title_and_an_overlapping_suptitle():
    """The check can fail: it catches both faults of issue #26 in plain matplotlib figures."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    narrow = Figure(figsize=(2, 2), dpi=100)
    FigureCanvasAgg(narrow)
    narrow.add_subplot().set_title("a title far wider than this two-inch figure")
    with pytest.raises(AssertionError, match="outside the canvas"):
        assert_text_fits(narrow)

    crowded = Figure(figsize=(6, 3), dpi=100)
    FigureCanvasAgg(crowded)
    for ax in crowded.subplots(1, 3):
        ax.set_title("panel")
        ax.set_position([ax.get_position().x0, 0.08, 0.25, 0.8])  # titles under the top
    crowded.suptitle("the figure's title")
    with pytest.raises(AssertionError, match="overlaps the axes title"):
        assert_text_fits(crowded)


@pytest.mark.parametrize("src, tgt, title", [
    (["▁forty", "-two", "</s>"], ["42", "</s>"], "cross-attention, last layer (mean of heads)"),
    (LONG, ["42", "</s>"], "cross-attention"),
    (["▁forty", "</s>"], LONG, "cross-attention"),
    (LONG, LONG, "cross-attention, last layer (mean of heads)"),
], ids=["long-title-short-source", "20-long-sources", "20-long-outputs", "20-by-20"])
def test_cross_attention_text_fits(src, tgt, title):
    fig = viz.figure_cross_attention(torch.rand(len(tgt), len(src)), src, tgt, title)
    texts = assert_text_fits(fig)
    assert {title, "source", "output", *src, *tgt} <= shown(texts)  # all labels drawn


@pytest.mark.parametrize("layers, heads, tokens, title", [
    (6, 12, MINILM, "self-attention: all-MiniLM-L6-v2 (pretrained)"),
    (2, 4, LONG, "self-attention: tiny (freshly initialised, seed 0: random weights)"),
    (1, 1, ["a", "b", "c"], "self-attention: all-MiniLM-L6-v2 (pretrained)"),
], ids=["minilm-6x12", "20-long-tokens", "one-small-panel"])
def test_attention_grid_text_fits(layers, heads, tokens, title):
    weights = torch.rand(layers, heads, len(tokens), len(tokens)).softmax(-1)
    fig = viz.figure_attention_grid(weights, tokens, title)
    texts = assert_text_fits(fig)
    assert len(fig.axes) == layers * heads + 1  # and the colour bar
    assert [t.get_text() for t in fig.texts] == [title]
    assert {title, f"layer {layers - 1} head {heads - 1}", "weight", *tokens} <= shown(texts)


@pytest.mark.parametrize("tokens", [MINILM, LONG, ["a", "b"]], ids=["minilm", "20-long", "two"])
def test_one_heads_map_is_labelled_with_its_weights_and_a_colour_bar(tokens):
    """``plot attention --layer L --head H``: readable labels, the axes named, a colour bar;
    up to 12 tokens each cell shows its weight, rounded, as the map draws it."""
    weights = torch.rand(len(tokens), len(tokens)).softmax(-1)
    fig = viz.figure_attention_head(weights, tokens, "self-attention\nlayer 2, head 3")
    texts = assert_text_fits(fig)
    assert {"key (the token attended to)", "query (the token attending)",
            "weight (each row sums to 1)", *tokens} <= shown(texts)
    cells = [t.get_text() for t in fig.axes[0].texts]
    if len(tokens) <= 12:
        assert cells == [f"{float(x):.2f}" for x in weights.flatten()]
    else:
        assert cells == []
    assert fig.axes[0].get_images()[0].get_array().shape == (len(tokens), len(tokens))


@pytest.mark.parametrize("image, grid, title", [
    (torch.rand(1, 8, 8), 4, "digits test image 3 (label 7)\nmodel: vit-tiny (freshly "
                             "initialised, seed 0: random weights)\npredicted 7 (p = 0.12)"),
    (torch.rand(3, 224, 224), 14, "an RGB image\nmodel: runs/an-imagenet-vit-with-a-long-name/"
                                  "final, a title far wider than the figure\npredicted 281"),
    (torch.rand(8, 8), 4, "x"),
], ids=["digits", "rgb-224-long-title", "two-dim-image-short-title"])
def test_image_attention_text_fits(image, grid, title):
    attention = torch.rand(grid * grid).softmax(-1).reshape(grid, grid)
    fig = viz.figure_image_attention(image, attention, title)
    texts = assert_text_fits(fig)
    assert [t.get_text() for t in fig.texts] == [title]
    assert {title, "image", "[CLS] attention rollout", "share of [CLS]"} <= shown(texts)
    overlay = fig.axes[1].get_images()[-1].get_array()  # the rollout, upsampled to the image
    assert overlay.shape == tuple(image.shape[-2:])
    patch = image.shape[-1] // grid
    assert float(overlay[patch * 1, patch * 2]) == pytest.approx(float(attention[1, 2]))


@pytest.mark.parametrize("max_len, d_model", [(100, 512), (2000, 16)])
def test_positional_encoding_text_fits(max_len, d_model):
    texts = assert_text_fits(viz.figure_positional_encoding(max_len, d_model))
    assert f"sinusoidal positional encoding, d_model = {d_model}" in shown(texts)
    assert "position" in shown(texts)


@pytest.mark.parametrize("title", [None, "lr = 1.0 · 512^-0.5 · min(step^-0.5, step · "
                                         "4000^-1.5), a title longer than six inches"],
                         ids=["class-name", "long-title"])
def test_schedule_text_fits(title):
    texts = assert_text_fits(viz.figure_schedule(NoamSchedule(512, 4000, 1.0), 300, title))
    assert (title or "NoamSchedule") in shown(texts)


def test_loss_curve_text_fits(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 9.0 / s, "nll": 8.0 / s}) + "\n"
                               for s in range(1, 101)))
    texts = assert_text_fits(viz.figure_loss_curve(metrics))
    assert {"label-smoothed loss", "NLL", "loss per target token"} <= shown(texts)


@pytest.mark.parametrize("plot, figure, args", [
    (viz.plot_cross_attention, viz.figure_cross_attention,
     (torch.rand(2, 20), LONG, ["42", "</s>"])),
    (viz.plot_attention_grid, viz.figure_attention_grid, (torch.rand(2, 3, 8, 8), MINILM)),
    (viz.plot_image_attention, viz.figure_image_attention, (torch.rand(1, 8, 8),
                                                            torch.rand(4, 4))),
    (viz.plot_positional_encoding, viz.figure_positional_encoding, (50, 64)),
    (viz.plot_schedule, viz.figure_schedule, (NoamSchedule(64, 100, 1.0), 500)),
], ids=["cross", "grid", "image", "positional", "schedule"])
def test_the_png_is_the_figure_that_fits(tmp_path, plot, figure, args):
    """What plot_* writes is figure_*'s canvas, whole: same pixel size."""
    path = tmp_path / "picture.png"
    assert plot(*args, path) == path
    width, height = figure(*args).canvas.get_width_height()
    assert imread(str(path)).shape[:2] == (height, width)
