"""attnlab explain --image: attention rollout against a hand computation and numpy; each
recomputed stage of the patch embedding equals the model's own values, and the checks fail on a
corrupted model or a wrong recomputation."""

import numpy as np
import pytest
import torch

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.explain import image as image_explain
from attnlab.explain.image import (
    attention_rollout,
    image_attention,
    load_image_model,
    make_image_subject,
    walk_image,
)
from attnlab.explain.report import format_text, format_value
from attnlab.storage import save_model_dir
from tests.cli.helpers import cli


def random_vit(seed: int = 0):
    """A freshly initialised vit-tiny (8×8 grayscale, 16 patches of 2×2), eval mode."""
    torch.manual_seed(seed)
    return build_model(ModelConfig.from_preset("vit-tiny")).eval()


def save_vit(folder, seed: int = 0):
    """A random vit-tiny saved as an attnlab model folder (no tokenizer); returns the folder."""
    model = random_vit(seed)
    return save_model_dir(folder, model, model.config, {})


@pytest.fixture(scope="module")
def vit():
    return random_vit(1)


@pytest.fixture(scope="module")
def image():
    torch.manual_seed(2)
    return torch.rand(1, 1, 8, 8)


# --- rollout -----------------------------------------------------------------------------------
def test_rollout_equals_a_hand_computation():
    """2 layers, 1 head, 3 tokens. Â = (A + I) / 2 (each row of A + I sums to 2):
    Â_1 = [[1, 0, 0], [.25, .75, 0], [0, 0, 1]], Â_2 = [[.5, .5, 0], [0, 1, 0], [0, .25, .75]],
    R = Â_2 · Â_1, row by row:
      row 0 = .5·[1, 0, 0] + .5·[.25, .75, 0]            = [.625, .375, 0]
      row 1 = 1·[.25, .75, 0]                            = [.25, .75, 0]
      row 2 = .25·[.25, .75, 0] + .75·[0, 0, 1]          = [.0625, .1875, .75]
    (Â_1 · Â_2 would give row 0 = [.5, .5, 0]: the order is checked too.)"""
    a1 = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    a2 = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 0.5]])
    weights = torch.stack([a1[None], a2[None]]).double()  # (layers 2, heads 1, 3, 3)
    expected = torch.tensor([[0.625, 0.375, 0.0], [0.25, 0.75, 0.0], [0.0625, 0.1875, 0.75]],
                            dtype=torch.float64)
    assert torch.allclose(attention_rollout(weights), expected, atol=1e-12)
    # two heads a layer, whose mean is A_l: the same rollout
    heads1 = [[[1.0, 0, 0], [1, 0, 0], [0, 0, 1]], [[1.0, 0, 0], [0, 1, 0], [0, 0, 1]]]
    heads2 = [[[0.0, 1, 0], [0, 1, 0], [0, 0, 1]], [[0.0, 1, 0], [0, 1, 0], [0, 1, 0]]]
    two_heads = torch.tensor([heads1, heads2], dtype=torch.float64)  # (2, 2, 3, 3)
    assert torch.allclose(attention_rollout(two_heads), expected, atol=1e-12)


def test_rollout_of_one_uniform_layer():
    """One layer, one head, uniform attention over 4 tokens: Â = (J/4 + I) / 2."""
    weights = torch.full((1, 1, 4, 4), 0.25, dtype=torch.float64)
    expected = (weights[0, 0] + torch.eye(4, dtype=torch.float64)) / 2
    assert torch.allclose(attention_rollout(weights), expected, atol=1e-12)


def test_rollout_equals_numpy_on_a_random_vit(vit, image):
    with torch.no_grad():
        vit(image, need_weights=True)
    weights = np.stack([layer.attn_weights[0].double().numpy() for layer in vit.encoder.layers])
    rollout = np.eye(weights.shape[-1])
    for layer in weights:  # layer 1 first
        a = layer.mean(axis=0) + np.eye(weights.shape[-1])
        a = a / a.sum(axis=1, keepdims=True)
        rollout = a @ rollout
    seen = image_attention(vit, image)
    assert np.allclose(seen.rollout.double().numpy(), rollout, atol=1e-6)
    assert np.allclose(seen.cls_map.double().numpy(), rollout[0, 1:].reshape(4, 4), atol=1e-6)
    assert np.allclose(rollout.sum(axis=1), 1.0)
    logits = vit(image)[0]
    assert seen.predicted == int(logits.argmax())
    assert float(seen.probabilities.sum()) == pytest.approx(1.0, abs=1e-6)


def test_rollout_refuses_a_wrong_shape():
    with pytest.raises(ValueError, match=r"\(layers, heads, seq, seq\)"):
        attention_rollout(torch.rand(3, 3))


# --- the walkthrough ---------------------------------------------------------------------------
@pytest.mark.parametrize("layer, head", [(0, 0), (2, 3)])
def test_stages_equal_the_models_own_values(vit, image, layer, head):
    subject = make_image_subject(vit, image, "random image", "random vit-tiny")
    w = walk_image(subject, layer, head)
    assert all(c.ok for c in w.checks) and len(w.checks) == 11, [
        (c.name, c.error) for c in w.checks if not c.ok]
    pe = vit.patch_embed
    patches = w.stage("patches").value
    assert patches.shape == (16, 4)
    for i in range(16):  # patch i: rows 2·(i // 4) …, columns 2·(i % 4) …, row by row
        r, c = 2 * (i // 4), 2 * (i % 4)
        assert torch.equal(patches[i], image[0, 0, r : r + 2, c : c + 2].flatten())
    with torch.no_grad():
        assert torch.allclose(w.stage("patch embeddings").value, pe.patches(image)[0], atol=1e-6)
        assert torch.equal(w.stage("[CLS] prepended").value[0], pe.cls[0, 0])
        assert torch.equal(w.stage("positions").value, pe.positions[0])
        z0 = w.stage("z₀").value
        assert z0.shape == (17, 64)
        assert torch.allclose(z0, vit.embeddings(image)[0], atol=1e-6)
        assert torch.allclose(w.stage("logits").value, vit(image)[0], atol=1e-5)
        hidden = vit.encode(image)[0, 0]
    assert torch.allclose(w.stage("[CLS] final state").value, hidden, atol=1e-5)
    probs = w.stage("prediction").value
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    assert w.stage("attention rollout").shape == (4, 4)
    assert w.stage("Q").shape == (17, 16) and w.stage("attention weights").shape == (17, 17)
    text = format_text(w, dims=3)
    assert "11 of 11 checks passed" in text and "image: random image" in text
    for title in ("patches", "z₀", "attention weights"):
        assert format_value(w.stage(title).value, 3, w.stage(title).rows,
                            w.stage(title).cols) in text


def failed(w) -> dict[str, float]:
    return {c.name: c.error for c in w.checks if not c.ok}


def test_corrupted_embeddings_fail_the_checks(vit, image):
    """z₀ changed inside the model's own pass (after the patch embedding computes it): the
    checks comparing the hand-computed z₀ with the model's fail, and report the change."""
    subject = make_image_subject(vit, image, "random image", "random vit-tiny")
    hook = vit.patch_embed.register_forward_hook(lambda m, a, out: out + 0.125)
    try:
        w = walk_image(subject)
    finally:
        hook.remove()
    bad = failed(w)
    assert any("model's own embeddings" in n for n in bad)
    assert any("first layer received" in n for n in bad)
    assert all(abs(e - 0.125) < 1e-6 for n, e in bad.items() if "z₀" in n)
    assert not any("patch convolution" in n or "unfold" in n for n in bad)  # those still agree


def test_corrupted_projection_fails_its_check(vit, image):
    subject = make_image_subject(vit, image, "random image", "random vit-tiny")
    hook = vit.patch_embed.projection.register_forward_hook(lambda m, a, out: out * 1.5)
    try:
        w = walk_image(subject)
    finally:
        hook.remove()
    assert any("patch convolution" in n for n in failed(w))


def test_a_wrong_recomputation_fails_the_checks(vit, image, monkeypatch):
    """Patches numbered column by column (the grid transposed): the by-hand patches no longer
    equal unfold's, nor does their projection equal the model's convolution."""
    right = image_explain.cut_patches

    def transposed(img, p):
        g = img.shape[-1] // p
        return right(img, p).reshape(g, g, -1).transpose(0, 1).reshape(g * g, -1)

    monkeypatch.setattr(image_explain, "cut_patches", transposed)
    w = walk_image(make_image_subject(vit, image, "random image", "random vit-tiny"))
    bad = failed(w)
    assert any("unfold" in n for n in bad) and any("patch convolution" in n for n in bad)


def test_a_model_without_a_classifier_stops_at_the_final_state(image):
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset("vit-tiny", head="none")).eval()
    w = walk_image(make_image_subject(model, image, "random image", "random"))
    assert all(c.ok for c in w.checks) and len(w.checks) == 10
    assert w.stage("prediction").value is None
    assert image_attention(model, image).predicted is None


def test_the_tiny_model_is_seeded():
    a, label, source = load_image_model(None, seed=3)
    b, _, _ = load_image_model(None, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert "random" in label and "seed 3" in source


# --- the command line --------------------------------------------------------------------------
def test_explain_image_cli_on_a_saved_model_and_the_tiny_one(capsys, tmp_path):
    folder = save_vit(tmp_path / "vit")
    page = tmp_path / "image.html"
    r = cli(capsys, "explain", "--model", folder, "--image", "digits:4", "--layer", "1",
            "--head", "2", "--dims", "3", "--html", page)
    assert r.code == 0, r.err
    assert f"running {folder}" in r.err
    assert "image: digits test image 4" in r.out and "11 of 11 checks passed" in r.out
    assert "z₀ = [x_cls; x_p·E + b] + E_pos" in r.out and "predicted class" in r.out
    assert "[CLS]" in page.read_text() and "p15" in page.read_text()
    r = cli(capsys, "explain", "--image", "digits:0", "--seed", "1")
    assert r.code == 0 and "vit-tiny (freshly initialised, seed 1" in r.out
