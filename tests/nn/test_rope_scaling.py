"""RoPE's frequencies under each scaling type, checked by hand from the formulas."""

import math

import pytest
import torch

from attnlab import ModelConfig
from attnlab.nn.rope_scaling import base_frequencies, scaled_frequencies


def test_base_frequencies():
    assert base_frequencies(4, 10000.0).tolist() == pytest.approx([1.0, 0.01])


def test_linear_slows_every_pair_alike():
    theta, factor = scaled_frequencies(8, 10000.0, {"rope_type": "linear", "factor": 4.0})
    assert theta.tolist() == pytest.approx((base_frequencies(8, 10000.0) / 4).tolist())
    assert factor == 1.0


def test_dynamic_changes_nothing_within_the_trained_context_and_grows_the_base_past_it():
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}
    within, _ = scaled_frequencies(8, 100.0, scaling, seq_len=20)
    assert within.tolist() == pytest.approx(base_frequencies(8, 100.0).tolist())
    past, _ = scaled_frequencies(8, 100.0, scaling, seq_len=64)  # base·(2·64/32 − 1)^(8/6)
    assert past.tolist() == pytest.approx(base_frequencies(8, 100.0 * 3 ** (8 / 6)).tolist())


def test_llama3_keeps_short_wavelengths_divides_long_ones_and_mixes_between():
    # d = 8, base 10000: θ = 1, 0.1, 0.01, 0.001; wavelengths 2π/θ ≈ 6.3, 63, 628, 6283.
    # L = 400, high factor 4 (kept below 100), low factor 1 (divided above 400)
    scaling = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 400,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    theta, _ = scaled_frequencies(8, 10000.0, scaling)
    assert theta[:2].tolist() == pytest.approx([1.0, 0.1])
    assert theta[2:].tolist() == pytest.approx([0.01 / 8, 0.001 / 8])
    scaling["original_max_position_embeddings"] = 2000  # now 628 lies between 500 and 2000
    a = (2000 / (2 * math.pi / 0.01) - 1) / (4 - 1)
    theta, _ = scaled_frequencies(8, 10000.0, scaling)
    assert theta[2].item() == pytest.approx((1 - a) * 0.01 / 8 + a * 0.01)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_attention():
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    theta, factor = scaled_frequencies(64, 10000.0, scaling)
    base = base_frequencies(64, 10000.0)
    assert theta[0].item() == pytest.approx(base[0].item())  # turns ≥ 32 times over 32 tokens
    assert theta[-1].item() == pytest.approx(base[-1].item() / 4)  # turns < once
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "ntk"}, "rope_type='ntk'"),
    ({"rope_type": "yarn", "factor": 2.0}, "needs a positive original_max_position_embeddings"),
    ({"rope_type": "linear", "factor": -1}, "needs a positive factor"),
])
def test_bad_rope_scaling_is_named(scaling, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_preset("llama-mini", rope_scaling=scaling)


def test_rope_scaling_needs_rope():
    with pytest.raises(ValueError, match="rope_scaling needs positional='rope'"):
        ModelConfig.from_preset("gpt-mini", rope_scaling={"rope_type": "linear", "factor": 2})


def test_the_table_is_the_rotation_the_model_applies():
    """A linear-scaled model at position 4·p rotates as the plain one at position p."""
    plain = ModelConfig.from_preset("llama-mini")
    scaled = ModelConfig.from_preset("llama-mini", rope_scaling={"rope_type": "linear",
                                                                "factor": 4.0})
    from attnlab.nn import build_positional

    a = build_positional("rope", plain.d_model, plain.n_heads, 256, plain.rope_base)
    b = build_positional("rope", scaled.d_model, scaled.n_heads, 256, scaled.rope_base,
                         scaled.rope_scaling)
    q = torch.randn(1, 4, 3, plain.d_k)
    got = b.rotate(q, q, torch.tensor([0, 4, 8]), torch.tensor([0, 4, 8]))[0]
    expected = a.rotate(q, q, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))[0]
    assert (got - expected).abs().max() <= 1e-6
