"""Positional encodings: hand values and the properties each is chosen for."""

import math

import torch

from attnlab.nn import (
    ALiBiPositionalEncoding,
    LearnedPositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    sinusoidal_table,
)


def test_sinusoidal_hand_values_d4():
    # d=4: frequencies 1 and 1/100; PE(p) = [sin p, cos p, sin(p/100), cos(p/100)].
    pe = sinusoidal_table(3, 4)
    expected = torch.tensor([[0, 1, 0, 1], [0.8415, 0.5403, 0.0100, 1.0000],
                             [0.9093, -0.4161, 0.0200, 0.9998]])
    assert torch.allclose(pe, expected, atol=1e-4)


def test_sinusoidal_is_a_buffer_not_a_parameter():
    enc = SinusoidalPositionalEncoding(16, 32)
    assert list(enc.parameters()) == []
    assert "pe" not in enc.state_dict()  # recomputed, never checkpointed
    x = torch.zeros(1, 5, 16)
    assert torch.equal(enc.embed(x, torch.arange(2, 7)), enc.pe[2:7][None])


def test_sinusoidal_shift_is_a_fixed_linear_map():
    # Fit one matrix M with PE(pos + k) = M·PE(pos) by least squares on the even positions,
    # then check it on the odd ones, never seen by the fit: one linear map serves every position.
    d, k = 16, 7
    pe = sinusoidal_table(5000, d, dtype=torch.float64)
    fit = torch.linalg.lstsq(pe[0 : 4990 : 2], pe[k : 4990 + k : 2]).solution  # (d, d)
    predicted = pe[1:4990:2] @ fit
    assert (predicted - pe[1 + k : 4990 + k : 2]).abs().max() < 1e-6
    # and it is the block rotation by k·ω_i the paper alludes to
    pe = sinusoidal_table(200, d, dtype=torch.float64)
    omega = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    shifted = torch.empty_like(pe)
    shifted[:, 0::2] = pe[:, 0::2] * c + pe[:, 1::2] * s
    shifted[:, 1::2] = pe[:, 1::2] * c - pe[:, 0::2] * s
    assert torch.allclose(shifted[: 200 - k], pe[k:], atol=1e-9)


def test_learned_positions_are_trainable_and_offset():
    enc = LearnedPositionalEncoding(8, 10)
    x = torch.zeros(2, 3, 8)
    out = enc.embed(x, torch.arange(4, 7))
    assert torch.equal(out[0], enc.weight[4:7].detach())
    out.sum().backward()
    assert enc.weight.grad[4:7].abs().sum() > 0 and enc.weight.grad[:4].abs().sum() == 0


def test_rope_scores_depend_only_on_offset():
    rope = RotaryPositionalEncoding(d_k=16, max_len=64)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        qr, kr = rope.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
        return (qr * kr).sum().item()

    for m, n in [(5, 2), (9, 0), (3, 3)]:
        for shift in (1, 10, 40):
            assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-4
    assert abs(score(5, 2) - score(5, 3)) > 1e-3  # and it does depend on the offset


def test_rope_preserves_norm_and_position_zero_is_identity():
    rope = RotaryPositionalEncoding(d_k=8)
    x = torch.randn(2, 3, 4, 8)
    r, _ = rope.rotate(x, x, torch.arange(10, 14), torch.arange(10, 14))
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    r0, _ = rope.rotate(x, x, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    assert torch.equal(r0, x)


def test_rope_rotates_pairs_i_and_i_plus_half():
    # d_k=4, base 10000: θ = [1, 0.01]; pair (x0, x2) rotates by pos·1, (x1, x3) by pos·0.01.
    rope = RotaryPositionalEncoding(d_k=4)
    x = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4)
    r, _ = rope.rotate(x, x, torch.tensor([2]), torch.tensor([2]))
    assert torch.allclose(r.flatten(), torch.tensor([math.cos(2), 0, math.sin(2), 0]), atol=1e-6)


def test_alibi_slopes_match_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence.
    twelve = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 + i) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve))


def test_alibi_bias_is_minus_slope_times_distance():
    enc = ALiBiPositionalEncoding(2)
    bias = enc.attention_bias(torch.arange(3), 3)  # (1, heads, 3, 3)
    dist = torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]])
    assert torch.allclose(bias[0, 0], -dist / 16) and torch.allclose(bias[0, 1], -dist / 256)
    # one cached step: the query at position 2 against keys 0..2 is the last row
    assert torch.allclose(enc.attention_bias(torch.tensor([2]), 3)[0, :, 0], bias[0, :, 2])


def test_tables_on_the_meta_device_are_shapes_and_elsewhere_the_cpu_tables():
    """A skeleton (built under ``torch.device("meta")``) holds float32 tables of the right
    shape and no values, even for a length no memory could hold; on the CPU, and after
    ``reset_buffers``, the tables are the formulas' (RoPE: cos of pos·θ, sinusoidal: sin of
    pos·ω at even features, ALiBi: 2^(−8h/H))."""
    with torch.device("meta"):
        huge = [RotaryPositionalEncoding(64, max_len=2**40), SinusoidalPositionalEncoding(
            16, max_len=2**40), ALiBiPositionalEncoding(4)]
    assert [tuple(b.shape) for m in huge for b in m.buffers()] == [
        (2**40, 64), (2**40, 64), (2**40, 16), (4,)]
    assert all(b.is_meta and b.dtype == torch.float32 for m in huge for b in m.buffers())
    rope, sinusoidal, alibi = (RotaryPositionalEncoding(8, max_len=5),
                               SinusoidalPositionalEncoding(6, max_len=5),
                               ALiBiPositionalEncoding(4))
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    assert torch.allclose(rope.cos[3, :4].double(), torch.cos(3 * theta), atol=1e-7)
    assert torch.allclose(sinusoidal.pe[2, 0::2].double(),
                          torch.sin(2 * 10000.0 ** (-torch.arange(0, 6, 2) / 6).double()),
                          atol=1e-6)
    assert torch.allclose(alibi.slopes, 2.0 ** (-8 * torch.arange(1, 5) / 4))
    with torch.device("meta"):
        small = RotaryPositionalEncoding(8, max_len=5)
    small.to_empty(device="cpu")
    small.reset_buffers()
    assert torch.equal(small.cos, rope.cos) and torch.equal(small.sin, rope.sin)
