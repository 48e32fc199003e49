"""Structured pruning: feed-forward channels ranked by a numpy hand computation of their weight
magnitudes, the pruned model equal to the original with those channels' W₂ columns zeroed;
layer importance equal to the final hidden states of the model run by a plain loop over its
layers with one left out, the pruned model equal to that loop without the dropped layers."""

import copy
import dataclasses

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.compression.structured import (
    drop_layers,
    feedforwards,
    layer_importance,
    least_important_layers,
    prune_channels,
)
from attnlab.errors import BadInput

PRESETS = {  # GPT-2 (GELU, biases), Llama (SwiGLU: W₃, no biases), BERT, an encoder-decoder
    "gpt-mini": dict(n_decoder_layers=3),
    "llama-mini": dict(n_decoder_layers=2, num_kv_heads=2),
    "bert-mini": dict(n_encoder_layers=2),
    "tiny": dict(n_encoder_layers=2, n_decoder_layers=3),
}


def tiny(preset, **fields):
    config = ModelConfig.from_preset(preset, vocab_size=40, d_model=64, n_heads=4, d_ff=128,
                                     max_len=32, dropout=0.0, **(fields or PRESETS[preset]))
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # biases and norm gains away from their initial 0 and 1
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def run(model, ids):
    with torch.no_grad():
        if model.config.arch == "encoder-decoder":
            return model(ids, ids[:, :6])
        return model(ids)


IDS = torch.randint(4, 40, (2, 10), generator=torch.Generator().manual_seed(1))


# --- feed-forward channels -----------------------------------------------------------------------
def numpy_kept(ffn, keep: int) -> np.ndarray:
    """The ``keep`` channels of largest Σ|W₁[j,:]| (+ Σ|W₃[j,:]|) + Σ|W₂[:,j]|, by numpy."""
    w1, w2 = ffn.w1.weight.detach().numpy(), ffn.w2.weight.detach().numpy()
    score = np.abs(w1).sum(axis=1) + np.abs(w2).sum(axis=0)
    if ffn.w3 is not None:
        score += np.abs(ffn.w3.weight.detach().numpy()).sum(axis=1)
    return np.sort(np.argsort(-score, kind="stable")[:keep])


@pytest.mark.parametrize("preset", list(PRESETS))
def test_channels_are_ranked_by_weight_magnitude_and_pruning_equals_zeroed_w2_columns(preset):
    model = tiny(preset)
    original = copy.deepcopy(model)
    reference = copy.deepcopy(model)  # W₂'s columns of the dropped channels set to zero
    kept = {}
    for path, ffn in feedforwards(reference).items():
        kept[path] = numpy_kept(ffn, 96)
        dropped = np.setdiff1d(np.arange(128), kept[path])
        assert len(dropped) == 32
        with torch.no_grad():
            ffn.w2.weight[:, torch.from_numpy(dropped)] = 0
    config = prune_channels(model, 0.25)
    assert config.d_ff == model.config.d_ff == 96
    assert config.extra["pruned"] == [{"ffn": 0.25, "d_ff": [128, 96]}]
    for path, ffn in feedforwards(model).items():
        old = feedforwards(original)[path]
        rows = torch.from_numpy(kept[path])
        assert torch.equal(ffn.w1.weight, old.w1.weight[rows])
        assert torch.equal(ffn.w2.weight, old.w2.weight[:, rows])
        if old.w3 is not None:
            assert torch.equal(ffn.w3.weight, old.w3.weight[rows])
        if old.w1.bias is not None:  # b₁ follows its channels; b₂ is the outputs'
            assert torch.equal(ffn.w1.bias, old.w1.bias[rows])
            assert torch.equal(ffn.w2.bias, old.w2.bias)
    d, gated = 64, preset == "llama-mini"
    per_channel = (3 if gated else 2) * d + (0 if gated else 1)  # rows, column, b₁
    removed = sum(p.numel() for p in original.parameters()) - sum(
        p.numel() for p in model.parameters())
    assert removed == 32 * per_channel * len(kept)
    assert torch.allclose(run(model, IDS), run(reference, IDS), atol=1e-5)
    change = (run(original, IDS) - run(reference, IDS)).norm() / run(original, IDS).norm()
    assert change > 1e-3  # the channels mattered


def test_a_pruned_model_rebuilds_from_its_config():
    model = tiny("tiny")
    config = prune_channels(model, 0.5)
    rebuilt = build_model(config).eval()
    rebuilt.load_state_dict(model.state_dict())
    assert torch.equal(run(rebuilt, IDS), run(model, IDS))


@pytest.mark.parametrize("fraction, message", [
    (0.0, "in (0, 1)"), (1.0, "in (0, 1)"), (-0.2, "in (0, 1)"), (0.001, "removes 0 channels"),
])
def test_bad_channel_shares(fraction, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        prune_channels(tiny("gpt-mini"), fraction)


# --- layers ------------------------------------------------------------------------------------
def loop_hidden(model, batch, skip=()):
    """The final hidden states by a plain loop over the layers, leaving out ``skip``
    (``(stack, index)`` pairs): ``(batch, seq, d)``."""
    if model.config.arch == "decoder":
        positions = torch.arange(batch.shape[1])
        x = model.embed_tokens(batch, positions)
        for i, layer in enumerate(model.blocks.layers):
            if ("blocks", i) not in skip:
                x = layer(x, None, True, model.positional, positions)
        return model.blocks.norm(x)
    src, tgt = batch
    x, _ = model._embed(model.src_embed, model.positional, src)
    for i, layer in enumerate(model.encoder.layers):
        if ("encoder", i) not in skip:
            x = layer(x)
    memory = model.encoder.norm(x)
    y, _ = model._embed(model.tgt_embed, model.positional, tgt)
    for i, layer in enumerate(model.decoder.layers):
        if ("decoder", i) not in skip:
            y = layer(y, memory)
    return model.decoder.norm(y)


def loop_importance(model, batches, real, stack, i) -> float:
    """‖H_with − H_without‖_F / ‖H_with‖_F over the real tokens of all batches, in numpy."""
    with torch.no_grad():
        pairs = list(zip(batches, real, strict=True))
        full = np.concatenate([loop_hidden(model, b)[r].numpy() for b, r in pairs])
        skip = np.concatenate([loop_hidden(model, b, {(stack, i)})[r].numpy() for b, r in pairs])
    return float(np.linalg.norm(full - skip) / np.linalg.norm(full))


def decoder_data():
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(4, 40, (2, 10), generator=g), torch.randint(4, 40, (3, 7),
                                                                          generator=g)]
    return batches, [torch.ones(b.shape, dtype=torch.bool) for b in batches]


def translator_data():
    """Two batches of (source, target) and which target tokens count (the others: padding)."""
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randint(4, 40, (2, 8), generator=g), torch.randint(4, 40, (2, 6),
                                                                          generator=g)),
               (torch.randint(4, 40, (3, 5), generator=g), torch.randint(4, 40, (3, 9),
                                                                          generator=g))]
    real = [torch.rand(t.shape, generator=g) < 0.7 for _, t in batches]
    return batches, real


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini", "tiny"])
def test_layer_importance_is_the_change_of_the_final_hidden_states_without_the_layer(preset):
    model = tiny(preset)
    batches, real = translator_data() if preset == "tiny" else decoder_data()
    masks = dict(zip(map(id, batches), real, strict=True))

    def forward(m, batch):
        if m.config.arch == "encoder-decoder":
            m(*batch)
        else:
            m(batch)
        return masks[id(batch)]

    scores = layer_importance(model, batches, forward)
    stacks = ["encoder", "decoder"] if preset == "tiny" else ["blocks"]
    assert list(scores) == stacks
    for stack in stacks:
        for i in range(len(scores[stack])):
            expected = loop_importance(model, batches, real, stack, i)
            assert scores[stack][i].item() == pytest.approx(expected, rel=1e-4), (stack, i)
            assert expected > 1e-3


def test_least_important_layers_rank_across_stacks_and_keep_one_a_stack():
    scores = {"encoder": torch.tensor([0.3, 0.1]), "decoder": torch.tensor([0.2, 0.05, 0.4])}
    assert least_important_layers(scores, 1) == {"decoder": [1]}
    assert least_important_layers(scores, 2) == {"encoder": [1], "decoder": [1]}
    assert least_important_layers(scores, 3) == {"encoder": [1], "decoder": [0, 1]}
    with pytest.raises(BadInput, match="5 layers in 2 stacks, each keeping one, so 1 to 3"):
        least_important_layers(scores, 4)


@pytest.mark.parametrize("preset, drop", [
    ("gpt-mini", {"blocks": [0, 2]}),
    ("tiny", {"encoder": [1], "decoder": [0]}),
])
def test_dropping_layers_equals_the_loop_without_them(preset, drop):
    model = tiny(preset)
    original = copy.deepcopy(model)
    config = drop_layers(model, drop)
    batch = translator_data()[0][0] if preset == "tiny" else decoder_data()[0][0]
    skip = {(stack, i) for stack, indices in drop.items() for i in indices}
    with torch.no_grad():
        expected = loop_hidden(original, batch, skip)
        theirs = model.lm_head(loop_hidden(model, batch))  # its own loop, over what is left
        ours = model(*batch) if preset == "tiny" else model(batch)
    assert torch.allclose(ours, original.lm_head(expected), atol=1e-5)
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert config.extra["pruned"] == [{"layers": drop}]
    if preset == "tiny":
        assert (config.n_encoder_layers, config.n_decoder_layers) == (1, 2)
    else:
        assert config.n_decoder_layers == 1
    rebuilt = build_model(config).eval()
    rebuilt.load_state_dict(model.state_dict())
    assert torch.equal(run(rebuilt, IDS), run(model, IDS))


def test_pruned_heads_follow_their_layers_to_their_new_indices():
    from attnlab.compression.prune import remove_heads

    model = tiny("gpt-mini")
    heads = remove_heads(model, {"blocks.layers.0.self_attn": [1], "blocks.layers.2.self_attn":
                                 [0, 3]})
    model.config = dataclasses.replace(model.config, pruned_heads=heads)
    original = copy.deepcopy(model)
    config = drop_layers(model, {"blocks": [0]})
    assert config.pruned_heads == {"blocks.layers.1.self_attn": [0, 3]}
    rebuilt = build_model(config).eval()
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = original.lm_head(loop_hidden(original, IDS, {("blocks", 0)}))
    assert torch.allclose(run(rebuilt, IDS), expected, atol=1e-5)


@pytest.mark.parametrize("drop, message", [
    ({"blocks": [0, 1, 2]}, "that leave one"),
    ({"blocks": [3]}, "not distinct indices"),
    ({"encoder": [0]}, "no layer stack 'encoder'"),
])
def test_bad_layer_lists(drop, message):
    with pytest.raises(BadInput, match=message):
        drop_layers(tiny("gpt-mini"), drop)
