"""PNG pictures exist and are not blank; the HTML page works in a real (headless) browser."""

import html
import re
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.image import imread

from attnlab.cli import main
from attnlab.explain import load_subject_model, make_subject, walk
from attnlab.explain.html import write_html


def not_blank(path):
    image = imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05  # real content, not a flat colour
    assert len(np.unique(image[..., :3].reshape(-1, 3), axis=0)) > 50


@pytest.mark.parametrize("args", [
    ["attention", "the cat sat on the mat"],
    ["positional", "--d-model", "128"],
    ["schedule", "--d-model", "512", "--warmup", "4000", "--steps", "20000"],
])
def test_plots_are_written_and_not_blank(tmp_path, args, capsys):
    out = tmp_path / "picture.png"
    assert main(["plot", *args, "--out", str(out)]) == 0
    not_blank(out)


def test_cross_attention_plot_from_a_checkpoint(tmp_path):
    assert main(["demo", "--out", str(tmp_path / "run"), "--steps", "30", "--n-train", "2000",
                 "--n-test", "5"]) == 0
    out = tmp_path / "cross.png"
    assert main(["plot", "cross", "forty-two", "--model", str(tmp_path / "run"), "--out",
                 str(out)]) == 0
    not_blank(out)


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run"]


def dom(page, fragment):
    result = subprocess.run([BROWSER, *FLAGS, "--dump-dom", f"file://{page}#{fragment}"],
                            capture_output=True, text=True, timeout=120)
    return result.stdout


@pytest.mark.skipif(BROWSER is None, reason="no chromium on this machine (.ci/run installs the "
                                            "Debian package)")
def test_html_page_in_headless_chromium(tmp_path):
    model, tok, label, *_ = load_subject_model(None, ["money in the bank grows"])
    w = walk(make_subject(model, tok, "money in the bank grows", label), 1, 2)
    page = write_html(w, tmp_path / "explain.html")
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained, offline

    first, second = dom(page, "layer=0&head=0"), dom(page, "layer=1&head=3&token=3")
    assert "layer 0 · head 0" in first and "layer 1 · head 3" in second
    rendered = re.search(r'<div id="tokens"[^>]*>(.*?)</div>', first).group(1)
    spans = [html.unescape(t) for t in re.findall(r"<span[^>]*>([^<]*)</span>", rendered)]
    assert spans == w.subject.tokens  # the tokens are rendered, in order

    def cells(d):
        heatmap = re.search(r'<table id="heatmap">(.*?)</table>', d, re.S).group(1)
        return [float(x) for x in re.findall(r'data-value="([0-9.e-]+)"', heatmap)]

    a, b = cells(first), cells(second)
    n = len(w.subject.tokens)
    assert len(a) == len(b) == n * n  # a full heatmap in both views
    assert a != b  # choosing another layer and head changes the view
    expected = w.own.weights[1][3].flatten().tolist()
    assert b == pytest.approx(expected, abs=1e-4)  # and shows that head's weights
    focus = re.search(r'id="focus">([^<]*)<', second).group(1)
    assert focus.startswith(f'"{w.subject.tokens[3]}" attends to:')  # hovering a token

    shot = tmp_path / "explain.png"
    subprocess.run([BROWSER, *FLAGS, "--window-size=1100,900", f"--screenshot={shot}",
                    f"file://{page}#layer=1&head=3&token=3"], capture_output=True, timeout=120)
    not_blank(shot)
