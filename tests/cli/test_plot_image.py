"""``attnlab plot attention --image`` and ``explain --image``: the PNG, and bad input (a text
model, an image of the wrong shape, a digit that does not exist, a sentence as well) refused in
one line, exit code 2.

The rollout and the walkthrough's checks are tested in tests/explain/test_image.py; the
figure's layout in tests/test_viz.py."""

import numpy as np
import pytest
from PIL import Image

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.storage import save_model_dir
from tests.cli.helpers import assert_bad_input, cli
from tests.explain.test_image import save_vit


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory):
    return save_vit(tmp_path_factory.mktemp("vit") / "model")


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    """A random bert-tiny model folder: an encoder that reads text, not images."""
    config = ModelConfig.from_preset("bert-tiny", vocab_size=40)
    return save_model_dir(tmp_path_factory.mktemp("bert") / "model", build_model(config),
                          config, {})


def test_plot_attention_image_writes_a_png(capsys, tmp_path, vit_folder):
    out = tmp_path / "rollout.png"
    r = cli(capsys, "plot", "attention", "--model", vit_folder, "--image", "digits:7",
            "--out", out)
    assert r.code == 0, r.err
    assert f"running {vit_folder}" in r.err and f"wrote {out}" in r.out
    with Image.open(out) as picture:
        assert picture.format == "PNG"
        width, height = picture.size
        pixels = np.asarray(picture.convert("RGB"))
    assert 400 <= width <= 2000 and 250 <= height <= 1500 and width > height
    assert pixels.std() > 10  # an image, not a flat colour


def test_plot_attention_image_with_the_random_tiny_vit(capsys, tmp_path):
    out = tmp_path / "rollout.png"
    r = cli(capsys, "plot", "attention", "--image", "digits:0", "--seed", "2", "--out", out)
    assert r.code == 0, r.err
    assert "random vit-tiny" in r.err and out.exists()


@pytest.mark.parametrize("command", [["plot", "attention"], ["explain"]])
def test_image_on_a_text_model_is_refused(capsys, tmp_path, text_folder, command):
    out = ["--out", tmp_path / "x.png"] if command[0] == "plot" else []
    r = cli(capsys, *command, "--model", text_folder, "--image", "digits:0", *out)
    line = assert_bad_input(r, "--image", str(text_folder))
    assert "arch='encoder'" in line and r.out == ""


@pytest.mark.parametrize("command", [["plot", "attention"], ["explain"]])
def test_a_sentence_on_a_vision_model_is_refused(capsys, tmp_path, vit_folder, command):
    out = ["--out", tmp_path / "x.png"] if command[0] == "plot" else []
    r = cli(capsys, *command, "the cat sat", "--model", vit_folder, *out)
    assert_bad_input(r, str(vit_folder), "--image", "vision")


@pytest.mark.parametrize("command", [["plot", "attention"], ["explain"]])
def test_wrong_image_shape_is_refused(capsys, tmp_path, vit_folder, command):
    bad = tmp_path / "five.npy"
    np.save(bad, np.zeros((5, 5), dtype=np.float32))
    out = ["--out", tmp_path / "x.png"] if command[0] == "plot" else []
    r = cli(capsys, *command, "--model", vit_folder, "--image", bad, *out)
    line = assert_bad_input(r, str(bad), "(1, 8, 8)")
    assert "(5, 5)" in line and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", [["plot", "attention"], ["explain"]])
def test_a_digit_that_does_not_exist_is_refused(capsys, tmp_path, command):
    out = ["--out", tmp_path / "x.png"] if command[0] == "plot" else []
    r = cli(capsys, *command, "--image", "digits:99999", *out)
    assert_bad_input(r, "--image digits:99999", "0 <= N <")


@pytest.mark.parametrize("argv, named", [
    (["plot", "attention", "the cat", "--image", "digits:0"], ["--image", "sentence"]),
    (["plot", "positional", "--image", "digits:0"], ["--image", "plot positional"]),
    (["explain", "the cat", "--image", "digits:0"], ["--image", "sentence"]),
    (["explain", "--image", "digits:0", "--compare", "a dog"], ["--image", "--compare"]),
    (["explain", "--backward", "--image", "digits:0"], ["--backward", "--image"]),
])
def test_image_with_what_it_cannot_take_is_refused(capsys, tmp_path, argv, named):
    extra = ["--out", tmp_path / "x.png"] if argv[0] == "plot" else []
    r = cli(capsys, *argv, *extra)
    assert_bad_input(r, *named)
    assert r.out == "" and not (tmp_path / "x.png").exists()
