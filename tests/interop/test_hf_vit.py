"""ViT: random-weight transformers models saved locally, loaded into attnlab with
``attnlab.load``, and attnlab's written back for transformers to load."""

import json

import pytest
import torch
import transformers

import attnlab
from attnlab import count_parameters, from_pretrained, save_pretrained
from attnlab.errors import BadInput

RGB = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=100,
           image_size=16, patch_size=4, num_channels=3, layer_norm_eps=1e-6,
           id2label={str(i): name for i, name in enumerate(["cat", "dog", "owl", "yak", "emu"])})
DIGITS = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
              image_size=8, patch_size=2, num_channels=1, hidden_act="gelu_new",
              id2label={str(i): str(i) for i in range(10)})
CASES = {"rgb": ("ViTForImageClassification", RGB), "digits": ("ViTForImageClassification", DIGITS),
         "rgb-bare": ("ViTModel", RGB),
         # no biases on query, key and value; the attention output and the MLP keep theirs
         "no-qkv-bias": ("ViTForImageClassification", {**RGB, "qkv_bias": False})}
FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "hidden_act", "layer_norm_eps", "image_size", "patch_size", "num_channels", "qkv_bias",
          "id2label", "hidden_dropout_prob", "attention_probs_dropout_prob"]


def pixels(hf, batch=4):
    side, c = hf["image_size"], hf["num_channels"]
    return torch.randn(batch, c, side, side, generator=torch.Generator().manual_seed(1))


def output(cls_name, theirs_out):
    return theirs_out.logits if cls_name == "ViTForImageClassification" else \
        theirs_out.last_hidden_state


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(class name, its config, the transformers model, its folder, what attnlab.load read)."""
    cls_name, hf = CASES[request.param]
    torch.manual_seed(0)
    theirs = getattr(transformers, cls_name)(transformers.ViTConfig(**hf,
                                                                    attn_implementation="eager"))
    with torch.no_grad():  # non-trivial norms, biases and head, so copying them is tested
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    theirs.eval()
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return cls_name, hf, theirs, folder, attnlab.load(folder)


def test_load_gives_a_vision_model_without_tokenizers(pair):
    cls_name, hf, _, folder, loaded = pair
    n = (hf["image_size"] // hf["patch_size"]) ** 2
    assert loaded.kind == "vision" and loaded.tokenizers == {} and loaded.path == folder
    assert loaded.max_len == n + 1
    assert loaded.config.head == ("classify" if cls_name != "ViTModel" else "none")
    assert not loaded.model.training


def test_outputs_match_transformers(pair):
    cls_name, hf, theirs, _, loaded = pair
    x = pixels(hf)
    with torch.no_grad():
        expected = output(cls_name, theirs(pixel_values=x))
        got = loaded.model(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4


def test_attention_weights_and_hidden_states_of_every_layer_match(pair):
    cls_name, hf, theirs, _, loaded = pair
    model, x = loaded.model, pixels(hf)
    captured = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append(o))
             for layer in model.encoder.layers]
    with torch.no_grad():
        model.encode(x, need_weights=True)
        out = theirs(pixel_values=x, output_attentions=True, output_hidden_states=True)
    for h in hooks:
        h.remove()
    hidden = out.hidden_states[1:]
    attentions = out.attentions
    assert len(captured) == len(hidden) == len(attentions) == hf["num_hidden_layers"]
    for layer, ours_h, e_h, e_w in zip(model.encoder.layers, captured, hidden, attentions,
                                       strict=True):
        assert (ours_h - e_h).abs().max() <= 1e-4
        assert layer.attn_weights.shape == e_w.shape
        assert (layer.attn_weights - e_w).abs().max() <= 1e-5


def test_parameter_count_equals_transformers(pair):
    cls_name, _, theirs, _, loaded = pair
    pooler = sum(p.numel() for p in theirs.pooler.parameters()) if cls_name == "ViTModel" else 0
    assert count_parameters(loaded.model) == count_parameters(theirs) - pooler  # no tanh pooler


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    cls_name, hf, theirs, folder, loaded = pair
    save_pretrained(loaded.model, tmp_path)
    back = getattr(transformers, cls_name).from_pretrained(tmp_path,
                                                           attn_implementation="eager").eval()
    x = pixels(hf)
    with torch.no_grad():
        expected = output(cls_name, theirs(pixel_values=x))
        assert torch.equal(output(cls_name, back(pixel_values=x)), expected)
        again = from_pretrained(tmp_path)  # and back into attnlab
        assert torch.equal(again(x), loaded.model(x))
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((folder / "config.json").read_text())
    assert written["architectures"] == [cls_name] and written["model_type"] == "vit"
    assert {f: written[f] for f in FIELDS} == {f: original[f] for f in FIELDS}


def folder_with(tmp_path, pair, **changes):
    """A copy of the pair's folder with config.json fields changed (None: removed)."""
    _, _, _, folder, _ = pair
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    hf = json.loads((folder / "config.json").read_text())
    hf.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


@pytest.mark.parametrize("changes, message", [
    (lambda hf: dict(image_size=hf["image_size"] + 1),
     r"image_size=\d+ is not divisible by patch_size=\d"),
    (lambda hf: dict(qkv_bias="no"), "qkv_bias='no': expected bool"),
    (lambda hf: dict(architectures=["ViTForMaskedImageModeling"]), "masked image modelling"),
    (lambda hf: dict(architectures=["ViTForVideo"]),
     "architectures='ViTForVideo' is not supported"),
    (lambda hf: dict(image_size=[16, 8]), "only square images"),
    (lambda hf: dict(patch_size=[2, 4]), "only square images"),
    (lambda hf: dict(hidden_act="quick_gelu"), "hidden_act='quick_gelu' is not supported"),
    (lambda hf: dict(num_channels="3"), "num_channels='3': expected int"),
], ids=["indivisible", "qkv-bias", "mim", "unknown-class", "non-square", "non-square-patch",
        "activation", "channels-type"])
def test_unsupported_or_malformed_configs_are_one_bad_input(tmp_path, pair, changes, message):
    folder = folder_with(tmp_path, pair, **changes(pair[1]))
    with pytest.raises(BadInput, match=message) as e:
        attnlab.load(folder)
    assert str(e.value).startswith(str(folder / "config.json")) and "\n" not in str(e.value)


def test_square_sizes_as_pairs_load(tmp_path, pair):
    _, hf, _, _, loaded = pair
    side, patch = hf["image_size"], hf["patch_size"]
    folder = folder_with(tmp_path, pair, image_size=[side, side], patch_size=[patch, patch])
    x = pixels(hf)
    with torch.no_grad():
        assert torch.equal(from_pretrained(folder)(x), loaded.model(x))


def test_weights_that_do_not_fit_the_config_are_named(tmp_path, pair):
    folder = folder_with(tmp_path, pair, num_channels=2)
    with pytest.raises(BadInput, match="patch_embeddings.projection.weight"):
        attnlab.load(folder)


def test_wrong_image_shape_on_a_loaded_model(pair):
    _, hf, _, _, loaded = pair
    side = hf["image_size"]
    with pytest.raises(BadInput, match=rf"got \(2, 5, {side}, {side}\)"):
        loaded.model(torch.zeros(2, 5, side, side))


def test_prefix_free_classifier_and_prefixed_bare_model_load(tmp_path, pair):
    """Checkpoints that store a headed model without the ``vit.`` prefix, or a bare one with
    it, load to the same weights."""
    from safetensors.torch import load_file, save_file

    cls_name, _, _, folder, loaded = pair
    weights = load_file(str(folder / "model.safetensors"))
    if cls_name == "ViTModel":
        renamed = {f"vit.{k}": v for k, v in weights.items()}
    else:
        renamed = {k.removeprefix("vit."): v for k, v in weights.items()}
    folder_with(tmp_path, pair)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    other = from_pretrained(tmp_path)
    for (name, a), b in zip(loaded.model.state_dict().items(), other.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
