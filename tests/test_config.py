import re

import pytest

from attnlab import PRESETS, ModelConfig


def test_json_round_trip(tmp_path):
    cfg = ModelConfig.from_preset("small", positional="rope", num_kv_heads=2)
    path = tmp_path / "config.json"
    cfg.to_json(path)
    assert ModelConfig.from_json(path) == cfg
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_presets_from_the_paper():
    base, big = ModelConfig.from_preset("base"), ModelConfig.from_preset("big")
    assert (base.n_encoder_layers, base.d_model, base.n_heads, base.d_ff, base.dropout) == (
        6, 512, 8, 2048, 0.1)
    assert (big.d_model, big.n_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.3)
    assert base.d_k == 64 and base.norm_placement == "post" and base.activation == "relu"
    assert {"base", "big", "small", "tiny"} <= set(PRESETS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=30, n_heads=4), "d_model=30 is not divisible by n_heads=4"),
    (dict(positional="fourier"), "positional='fourier'"),
    (dict(num_kv_heads=3), "not divisible by num_kv_heads=3"),
    (dict(d_model="abc"), "d_model='abc': expected int"),  # e.g. --set d_model=abc
    (dict(max_len=True), "max_len=True: expected int"),
    (dict(dropout="0.1"), "dropout='0.1': expected float"),
    (dict(n_heads=0), "n_heads must be >= 1, got 0"),
    (dict(vocab_size=-5), "vocab_size must be >= 1, got -5"),
    (dict(norm_eps=float("nan")), "norm_eps must be >= 0.0, got nan"),
    (dict(dropout=1.0), "dropout must be < 1, got 1.0"),
])
def test_invalid_configs_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        ModelConfig.from_preset("huge")
    with pytest.raises(ValueError, match="unknown config field"):
        ModelConfig.from_dict({"d_modle": 3})


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "d_model": 64,\n  oops\n}')
    with pytest.raises(ValueError, match=r"c\.json:3: invalid JSON"):
        ModelConfig.from_json(path)


@pytest.mark.parametrize("preset, fields, message", [
    ("t5-small", dict(relative_buckets=3), "relative_buckets must be >= 4"),
    ("t5-small", dict(relative_buckets=32, relative_max_distance=16),
     "relative_max_distance > relative_buckets / 2"),
    ("bert-tiny", dict(positional="relative"), "positional='relative' (T5) is for encoder-dec"),
    ("gpt-mini", dict(share_layers=True), "share_layers (ALBERT) is for encoders"),
    ("bert-tiny", dict(sliding_window=4), "sliding_window is for decoders"),
    ("llama-mini", dict(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                      "original_max_position_embeddings": 64,
                                      "beta_fast": "x"}), "beta_fast must be a number >= 0"),
    ("llama-mini", dict(rope_scaling={"rope_type": "linear", "factor": 2.0, "scale": 3}),
     "unknown field(s) scale for linear"),
    ("llama-mini", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     "dynamic needs a positive original_max_position_embeddings"),
    ("llama-mini", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                      "original_max_position_embeddings": 64,
                                      "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
     "high_freq_factor > low_freq_factor"),
    ("llama-mini", dict(rope_base=1.0, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                     "original_max_position_embeddings": 64}),
     "yarn needs rope_base > 1"),
])
def test_the_new_families_knobs_are_checked(preset, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_preset(preset, **fields)



def test_a_preset_on_a_smaller_vocabulary_keeps_its_special_ids_inside_it():
    """GPT-2's <|endoftext|> is its vocabulary's last id (50256 of 50257): on a smaller
    vocabulary it is that vocabulary's last id; ids already inside (Llama's 0..2) and ids
    given explicitly stay."""
    gpt = ModelConfig.from_preset("gpt-mini", vocab_size=40)
    assert (gpt.pad_id, gpt.unk_id, gpt.bos_id, gpt.eos_id) == (39, 39, 39, 39)
    assert ModelConfig.from_preset("gpt2").eos_id == 50256  # GPT-2 itself: 50257 tokens
    assert ModelConfig.from_preset("gpt-mini", vocab_size=40, eos_id=7).eos_id == 7
    llama = ModelConfig.from_preset("llama", vocab_size=40)
    assert (llama.pad_id, llama.unk_id, llama.bos_id, llama.eos_id) == (2, 0, 1, 2)


@pytest.mark.parametrize("field", ["pad_id", "unk_id", "bos_id", "eos_id"])
def test_a_saved_folder_whose_special_id_is_past_its_vocabulary_is_one_line(tmp_path, capsys,
                                                                           field):
    """A special id indexes the embedding table (bos, pad) or could never be emitted (eos):
    loading the folder names the field and the vocabulary, for attnlab's own config.json as
    for a Hugging Face one (tests/interop/test_hf_token_ids.py)."""
    import json

    import attnlab
    from attnlab.build import build_model
    from attnlab.errors import BadInput
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers import CharTokenizer
    from tests.cli.helpers import assert_bad_input, cli

    tok = CharTokenizer.train(["abcdefghij"])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=16,
                                     n_heads=2, d_ff=32, n_decoder_layers=1, max_len=16)
    save_model_dir(tmp_path, build_model(config), config, {"text": tok.to_dict()})
    assert attnlab.load(tmp_path).config.eos_id == tok.vocab_size - 1  # the honest folder
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, field: tok.vocab_size}))
    last = tok.vocab_size - 1
    with pytest.raises(BadInput, match=rf"{field}={tok.vocab_size} .*0\.\.{last}"):
        attnlab.load(tmp_path)
    r = cli(capsys, "generate", "--model", tmp_path, "--prompt", "abc", "--device", "cpu",
            "--max-new-tokens", "2")
    assert_bad_input(r, str(tmp_path / "config.json"), field)
