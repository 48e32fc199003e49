"""The Vision Transformer: shapes, the patch embedding against Eq. 1 computed by hand, attention
weights per layer, image-shape errors, gradients (to [CLS] and the positions, and against finite
differences), the config's checks, parameter counts, and a model folder round trip."""

import pytest
import torch

import attnlab
from attnlab import ModelConfig, build_model, count_parameters
from attnlab.build import check_affordable, skeleton
from attnlab.errors import BadInput
from attnlab.models import ViT
from attnlab.nn import PatchEmbedding
from attnlab.storage import save_model_dir
from tests.gradients import directional_derivatives


def tiny(**overrides):
    torch.manual_seed(0)
    config = ModelConfig.from_preset("vit-tiny", **{"dropout": 0.0, **overrides})
    return ViT(config).eval()


def images(batch=3, channels=1, side=8):
    return torch.randn(batch, channels, side, side, generator=torch.Generator().manual_seed(1))


def test_shapes_of_every_output():
    model = tiny()
    x = images()
    assert model.n_patches == 16
    assert model.embeddings(x).shape == (3, 17, 64)
    assert model.encode(x).shape == (3, 17, 64)
    assert model(x).shape == (3, 10)
    bare = tiny(head="none")
    assert bare(x).shape == (3, 17, 64)
    rgb = tiny(image_size=12, patch_size=4, num_channels=3, num_labels=4)
    assert rgb(images(2, 3, 12)).shape == (2, 4) and rgb.n_patches == 9
    whole = tiny(patch_size=8)  # one patch: the sequence is [CLS] and the whole image
    assert whole.encode(images()).shape == (3, 2, 64)


def test_classifier_reads_the_final_normed_cls_vector():
    model = tiny()
    x = images()
    with torch.no_grad():
        h = model.encode(x)
        assert torch.equal(model(x), model.classifier(h[:, 0]))
        bare = tiny(head="none")
        bare.load_state_dict({k: v for k, v in model.state_dict().items()
                              if not k.startswith("classifier.")})
        assert torch.equal(bare(x), h)


@pytest.mark.parametrize("channels, side, patch", [(1, 8, 2), (3, 12, 4), (2, 6, 3)])
def test_patch_embedding_equals_eq1_by_hand(channels, side, patch):
    """z₀ = [x_cls; x_p¹E; …; x_pᴺE] + E_pos with the patches cut out by reshaping (row by row,
    each flattened channel, row, column as Conv2d orders its kernel) and E the conv weight."""
    torch.manual_seed(0)
    embed = PatchEmbedding(side, patch, channels, 16)
    with torch.no_grad():
        for p in embed.parameters():
            p.normal_()
    x = images(2, channels, side)
    g = side // patch
    patches = (x.reshape(2, channels, g, patch, g, patch)  # (b, C, row, i, col, j)
               .permute(0, 2, 4, 1, 3, 5)  # (b, row, col, C, i, j)
               .reshape(2, g * g, channels * patch * patch))  # x_p: (b, N, P²·C)
    E = embed.projection.weight.reshape(16, -1).T  # (P²·C, D)
    by_hand = patches @ E + embed.projection.bias
    by_hand = torch.cat([embed.cls.expand(2, 1, 16), by_hand], 1) + embed.positions
    with torch.no_grad():
        assert (embed(x) - by_hand).abs().max() <= 1e-5
        unfolded = torch.nn.functional.unfold(x, patch, stride=patch).transpose(1, 2)
        assert torch.allclose(unfolded, patches)  # the same cut as torch's own im2col


def test_attention_weights_of_every_layer():
    model = tiny()
    with torch.no_grad():
        model.encode(images(), need_weights=True)
    for layer in model.encoder.layers:
        w = layer.attn_weights
        assert w.shape == (3, 4, 17, 17)  # (batch, heads, 1 + N, 1 + N)
        assert torch.allclose(w.sum(-1), torch.ones(3, 4, 17), atol=1e-5)
    with torch.no_grad():  # the weights do not change the output
        assert torch.allclose(model(images(), need_weights=True), model(images()), atol=1e-6)


@pytest.mark.parametrize("shape, got", [
    ((2, 3, 8, 8), "(2, 3, 8, 8)"),  # channels
    ((2, 1, 8, 9), "(2, 1, 8, 9)"),  # width
    ((2, 1, 16, 16), "(2, 1, 16, 16)"),  # size
    ((1, 8, 8), "(1, 8, 8)"),  # no batch dimension
    ((8, 8), "(8, 8)"),
])
def test_wrong_image_shape_is_one_line_naming_expected_and_got(shape, got):
    model = tiny()
    with pytest.raises(BadInput) as e:
        model(torch.zeros(shape))
    message = str(e.value)
    assert "\n" not in message
    assert "(batch, 1, 8, 8)" in message and f"got {got}" in message


def test_gradients_reach_cls_positions_and_patch_kernel():
    model = tiny()
    model(images()).logsumexp(-1).sum().backward()
    embed = model.patch_embed
    assert embed.cls.grad.abs().sum() > 0
    assert (embed.positions.grad.abs().sum(-1) > 0).all()  # every one of the 1 + N positions
    assert embed.projection.weight.grad.abs().sum() > 0
    assert embed.projection.bias.grad.abs().sum() > 0


def test_gradients_equal_finite_differences():
    model = tiny(n_encoder_layers=2).double()
    x = images().double()
    labels = torch.tensor([1, 7, 3])

    def loss():
        return torch.nn.functional.cross_entropy(model(x), labels)

    analytic, numeric = directional_derivatives(loss, list(model.parameters()))
    assert abs(analytic - numeric) <= 1e-6 * abs(analytic)


def test_dropout_only_in_training():
    model = tiny(dropout=0.5)
    x = images()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
        model.train()
        assert not torch.equal(model(x), model(x))


@pytest.mark.parametrize("overrides, message", [
    (dict(image_size=None), "needs image_size and patch_size"),
    (dict(patch_size=None), "needs image_size and patch_size"),
    (dict(image_size=10, patch_size=4), "image_size=10 is not divisible by patch_size=4"),
    (dict(patch_size=0), "patch_size must be >= 1, got 0"),
    (dict(num_channels=0), "num_channels must be >= 1, got 0"),
    (dict(image_size="8"), "image_size='8': expected int"),
    (dict(positional="sinusoidal"), "needs positional='learned'"),
    (dict(head="mlm"), "has head classify or none, got 'mlm'"),
    (dict(activation="swiglu"), "swiglu"),
])
def test_invalid_vision_configs_are_one_bad_input(overrides, message):
    with pytest.raises(BadInput, match=message):
        ModelConfig.from_preset("vit-tiny", **overrides)


def test_other_architectures_are_not_a_vit():
    with pytest.raises(BadInput, match="ViT needs arch='vision'"):
        ViT(ModelConfig.from_preset("bert-tiny"))


def vit_count(d, ff, layers, channels, patch, n_patches, labels):
    """By formula: the patch kernel C·P²·d + d, [CLS] d, positions (N + 1)·d; per layer
    attention 4(d² + d), FFN 2·d·ff + ff + d, two LayerNorms 2·2d; the final LayerNorm 2d; the
    classifier labels·(d + 1)."""
    embed = channels * patch * patch * d + d + d + (n_patches + 1) * d
    layer = 4 * (d * d + d) + 2 * d * ff + ff + d + 2 * 2 * d
    return embed + layers * layer + 2 * d + labels * (d + 1)


@pytest.mark.parametrize("preset, exact, expected", [
    ("vit-tiny", None, vit_count(64, 128, 4, 1, 2, 16, 10)),
    ("vit-base", 86_567_656, vit_count(768, 3072, 12, 3, 16, 196, 1000)),  # ViT-B/16, "86M"
])
def test_parameter_counts_equal_the_formula(preset, exact, expected):
    config = ModelConfig.from_preset(preset)
    counted = count_parameters(skeleton(config))
    assert counted == expected == count_parameters(config)
    if exact is not None:
        assert counted == exact


def test_size_check_refuses_a_config_its_weights_cannot_hold(tmp_path):
    config = ModelConfig.from_preset("vit-tiny", n_encoder_layers=10_000)
    with pytest.raises(BadInput, match="the config and the weights disagree"):
        check_affordable(config, tmp_path / "model.safetensors", file_bytes=600_000)


def test_model_folder_round_trip(tmp_path):
    model = tiny()
    save_model_dir(tmp_path / "vit", model, model.config, {})
    loaded = attnlab.load(tmp_path / "vit")
    assert loaded.kind == "vision" and loaded.tokenizers == {}
    assert loaded.expect("vision", "test") is loaded
    with pytest.raises(attnlab.errors.UnsupportedFormat, match="arch='vision'"):
        loaded.expect("encoder", "encoder classify")
    x = images()
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))


def test_build_model_builds_a_vit():
    model = build_model(ModelConfig.from_preset("vit-tiny"))
    assert isinstance(model, ViT)
    assert list(model.components()) == ["patch embedding", "encoder layer (one)", "encoder",
                                        "classifier"]
