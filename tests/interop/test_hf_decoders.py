"""GPT-2 and Llama: random-weight transformers models saved locally, loaded into attnlab."""

import json
import re

import pytest
import torch
import transformers

from attnlab import from_pretrained, save_pretrained
from attnlab.generation import generate

GPT2 = dict(vocab_size=300, n_embd=64, n_head=4, n_layer=3, n_positions=128,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=299, eos_token_id=299)
LLAMA = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=172, num_hidden_layers=3, max_position_embeddings=128,
             rms_norm_eps=1e-6, tie_word_embeddings=False)


def hf_model(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    with torch.no_grad():  # non-trivial norms and biases, so copying them is tested
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    theirs = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return request.param, theirs, from_pretrained(folder), folder


def test_logits_match_transformers(pair):
    _, theirs, ours, _ = pair
    ids = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids)
    assert (got - expected).abs().max() <= 1e-4


def test_greedy_twenty_tokens_match_transformers(pair):
    _, theirs, ours, _ = pair
    prompt = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(2))
    theirs.generation_config.eos_token_id = None  # both sides: exactly 20 tokens, no stop
    expected = theirs.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    got = generate(ours, prompt, max_new_tokens=20)
    assert got.tolist() == expected.tolist()


def test_left_padded_batch_with_repetition_penalty_matches_transformers(pair):
    _, theirs, ours, _ = pair
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(1, 300, (2, 6), generator=g)
    mask = torch.ones_like(prompt)
    prompt[0, :3], mask[0, :3] = 0, 0  # the first row is a 3-token prompt, left-padded
    theirs.generation_config.eos_token_id = None
    expected = theirs.generate(prompt, attention_mask=mask, max_new_tokens=15, do_sample=False,
                               repetition_penalty=1.5, pad_token_id=0)
    got = generate(ours, prompt, max_new_tokens=15, attention_mask=mask, repetition_penalty=1.5)
    assert got.tolist() == expected.tolist()
    plain = generate(ours, prompt, max_new_tokens=15, attention_mask=mask)
    assert plain.tolist() != got.tolist()  # the penalty changed something, so it was tested


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    kind, theirs, ours, _ = pair
    save_pretrained(ours, tmp_path)
    cls = transformers.GPT2LMHeadModel if kind == "gpt2" else transformers.LlamaForCausalLM
    back = cls.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (back(ids).logits - theirs(ids).logits).abs().max() <= 1e-5


def test_unknown_architecture_names_field_and_value(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="model_type='mamba' is not supported"):
        from_pretrained(tmp_path)


def test_prompt_longer_than_context_is_a_clear_error(pair):
    _, _, ours, _ = pair
    with pytest.raises(ValueError, match="exceeds the model's context max_len=128"):
        ours(torch.zeros(1, 129, dtype=torch.long))


def test_a_minimal_config_json_takes_transformers_defaults(tmp_path):
    """Fields left out of config.json (here the activation) take transformers' defaults."""
    minimal = dict(model_type="gpt2", vocab_size=100, n_embd=32, n_layer=1, n_head=4,
                   n_positions=32)
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**minimal)).eval()
    theirs.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(minimal))
    ids = torch.arange(10)[None]
    with torch.no_grad():
        assert (from_pretrained(tmp_path)(ids) - theirs(ids).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "gpt2",', "config.json:1: invalid JSON"),
    ('{"model_type": "gpt2", "n_embd": "wide"}', "config.json: config field d_model='wide'"),
    ('{"model_type": "gpt2", "activation_function": "quick_gelu"}',
     "config.json: activation_function='quick_gelu' is not supported for gpt2"),
])
def test_bad_config_json_names_the_file(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        from_pretrained(tmp_path)
