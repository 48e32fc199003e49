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
