"""Contexts longer than training: Llama with each rope_scaling type, and Mistral's sliding
window, as random-weight transformers models saved locally and loaded into attnlab."""

import json

import pytest
import torch
import transformers

from attnlab import ModelConfig, build_model, from_pretrained, load, save_pretrained
from attnlab.build import count_parameters
from attnlab.generation import generate
from attnlab.interop.hf_decoders import mistral_from_config, rope_from_hf

LLAMA = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=172, num_hidden_layers=2, rms_norm_eps=1e-6,
             tie_word_embeddings=False)
# Trained on 32 positions (max_position_embeddings for linear and dynamic, whose HF
# configs have no other field for it); the tests run 100.
SCALINGS = {
    "linear": dict(max_position_embeddings=128,
                   rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "dynamic": dict(max_position_embeddings=32,
                    rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
    # transformers ignores this original_max_position_embeddings for dynamic: so must we
    "dynamic-stated": dict(max_position_embeddings=32,
                           rope_scaling={"rope_type": "dynamic", "factor": 4.0,
                                         "original_max_position_embeddings": 16}),
    "yarn": dict(max_position_embeddings=128,
                 rope_scaling={"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}),
    "llama3": dict(max_position_embeddings=128,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                 "original_max_position_embeddings": 32,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
}
MISTRAL = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=172, num_hidden_layers=2, max_position_embeddings=256,
               rms_norm_eps=1e-6, sliding_window=8, tie_word_embeddings=False)


def perturbed(model):
    with torch.no_grad():  # non-trivial norms, so copying them is tested
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def ids_and_mask(length=100, pad=7):
    """Two rows of real ids (never 0: transformers' generate reads 0 as padding), the first
    left-padded by ``pad``."""
    ids = torch.randint(1, 300, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :pad], mask[0, :pad] = 0, 0
    return ids, mask


@pytest.fixture(scope="module", params=list(SCALINGS))
def scaled(request, tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA, **SCALINGS[request.param])
    theirs = perturbed(transformers.LlamaForCausalLM(config))
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return request.param, theirs, from_pretrained(folder), folder


def test_rope_scaling_logits_match_transformers_past_the_trained_context(scaled):
    kind, theirs, ours, folder = scaled
    assert ours.config.rope_scaling["rope_type"] == kind.split("-")[0]
    ids, mask = ids_and_mask()
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    real = mask.bool()
    assert (got - expected)[real].abs().max() <= 1e-4
    # the scaling is what made them equal: plain RoPE on the same weights differs past 32
    hf = json.loads((folder / "config.json").read_text())
    hf.pop("rope_scaling", None)
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    hf["max_position_embeddings"] = 128
    (folder.parent / f"{kind}-plain").mkdir(exist_ok=True)
    plain_folder = folder.parent / f"{kind}-plain"
    (plain_folder / "config.json").write_text(json.dumps(hf))
    (plain_folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with torch.no_grad():
        plain = from_pretrained(plain_folder)(ids, attention_mask=mask)
    assert (plain - expected)[:, 40:].abs().max() > 1e-3  # ten times the tolerance


def test_rope_scaling_greedy_matches_transformers(scaled):
    _, theirs, ours, _ = scaled
    prompt = ids_and_mask()[0][1:, :40]
    theirs.generation_config.eos_token_id = None
    expected = theirs.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert generate(ours, prompt, max_new_tokens=20).tolist() == expected.tolist()


def test_rope_scaling_round_trips_through_save_pretrained(scaled, tmp_path):
    kind, theirs, ours, _ = scaled
    save_pretrained(ours, tmp_path)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = ids_and_mask()
    with torch.no_grad():
        diff = back(ids, attention_mask=mask).logits - theirs(ids, attention_mask=mask).logits
    assert diff[mask.bool()].abs().max() <= 1e-5
    assert from_pretrained(tmp_path).config.rope_scaling == ours.config.rope_scaling


# As Qwen2.5 documents YaRN (and as Llama 3.x configs may state llama3): max_position_embeddings
# is the trained context, original_max_position_embeddings is left out, and the factor says
# how far past it the model reaches (4 × 32 = 128 positions here).
AS_DOCUMENTED = {
    "yarn": {"rope_type": "yarn", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0},
}


@pytest.mark.parametrize("kind", list(AS_DOCUMENTED))
def test_a_factor_past_max_position_embeddings_runs_as_transformers(kind, tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA, max_position_embeddings=32,
                                      rope_scaling=AS_DOCUMENTED[kind])
    perturbed(transformers.LlamaForCausalLM(config)).save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    # transformers writes the original it defaulted to; the documented configs leave it out
    assert hf["rope_parameters"].pop("original_max_position_embeddings") == 32
    (tmp_path / "config.json").write_text(json.dumps(hf))
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    loaded = load(tmp_path)
    assert loaded.config.max_len == 128
    ids, mask = ids_and_mask(length=70)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = loaded.model(ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max() <= 1e-4
    prompt = ids[1:, :60]  # and greedy decoding goes on past 32 positions as theirs does
    theirs.generation_config.eos_token_id = None
    expected = theirs.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert generate(loaded.model, prompt, max_new_tokens=20).tolist() == expected.tolist()


@pytest.mark.parametrize("kind, max_position, factor, original, context", [
    ("yarn", 32, 4.0, None, 128), ("yarn", 256, 4.0, 32, 256), ("yarn", 32, 2.5, 30, 75),
    ("llama3", 32, 8.0, None, 256), ("llama3", 1000, 8.0, 100, 1000),
    ("linear", 32, 4.0, None, 32), ("dynamic", 32, 4.0, 16, 128),  # today's rules
])
def test_the_context_under_rope_scaling(kind, max_position, factor, original, context):
    """YaRN and llama3: the larger of max_position_embeddings and factor × original (which
    defaults to max_position_embeddings); linear: max_position_embeddings; dynamic: that times
    the factor (transformers ignores its original_max_position_embeddings)."""
    scaling = {"rope_type": kind, "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0}
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    hf = {"max_position_embeddings": max_position, "rope_scaling": scaling}
    assert rope_from_hf(hf)[2] == context


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    torch.manual_seed(0)
    theirs = perturbed(transformers.MistralForCausalLM(transformers.MistralConfig(**MISTRAL)))
    folder = tmp_path_factory.mktemp("mistral")
    theirs.save_pretrained(folder)
    return theirs, from_pretrained(folder)


def test_mistral_logits_match_transformers_beyond_the_window(mistral):
    theirs, ours = mistral
    assert ours.config.sliding_window == 8
    ids, mask = ids_and_mask(length=30, pad=5)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max() <= 1e-4
    # the window matters: a 30-token sequence seen whole would give other logits
    with torch.no_grad():
        ours.config.sliding_window = None
        try:
            whole = ours(ids, attention_mask=mask)
        finally:
            ours.config.sliding_window = 8
    assert (whole - expected)[:, 10:].abs().max() > 1e-3


@pytest.mark.parametrize("padded", [False, True])
def test_mistral_greedy_text_matches_transformers_past_the_window(mistral, padded):
    theirs, ours = mistral
    ids, mask = ids_and_mask(length=12, pad=4)
    if not padded:
        ids, mask = ids[1:], mask[1:]
    theirs.generation_config.eos_token_id = None
    expected = theirs.generate(ids, attention_mask=mask, max_new_tokens=25, do_sample=False,
                               pad_token_id=0)
    got = generate(ours, ids, max_new_tokens=25, attention_mask=mask)
    assert got.tolist() == expected.tolist()
    cache = ours.new_cache()
    assert all(layer.window == 8 for layer in cache)


def test_mistral_round_trips_through_save_pretrained(mistral, tmp_path):
    theirs, ours = mistral
    save_pretrained(ours, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sliding_window"] == 8
    back = transformers.MistralForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = ids_and_mask(length=30, pad=5)
    with torch.no_grad():
        diff = back(ids, attention_mask=mask).logits - theirs(ids, attention_mask=mask).logits
    assert diff[mask.bool()].abs().max() <= 1e-5


def test_an_unknown_rope_type_names_it(tmp_path):
    hf = {"model_type": "llama", **LLAMA, "max_position_embeddings": 64,
          "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="rope_type='longrope' is not supported"):
        from_pretrained(tmp_path)


def test_a_llama_folder_cannot_hold_a_sliding_window(mistral, tmp_path):
    _, ours = mistral
    ours.config.extra["hf_model_type"] = "llama"
    try:
        with pytest.raises(ValueError, match="sliding_window=8 has no LlamaForCausalLM"):
            save_pretrained(ours, tmp_path)
    finally:
        ours.config.extra["hf_model_type"] = "mistral"


@pytest.mark.parametrize("preset", ["mistral-tiny", "mistral-7b"])
def test_mistral_presets_count_as_transformers(preset):
    config = ModelConfig.from_preset(preset)
    with torch.device("meta"):
        ours = build_model(config)
        theirs = transformers.MistralForCausalLM(
            transformers.MistralConfig(**mistral_from_config(config)))
    assert count_parameters(ours) == theirs.num_parameters()


def test_a_gpt2_folder_cannot_hold_a_sliding_window(tmp_path):
    config = ModelConfig.from_preset("gpt-mini", sliding_window=4)
    with pytest.raises(ValueError, match="sliding_window=4 has no GPT2LMHeadModel equivalent"):
        save_pretrained(build_model(config), tmp_path)
