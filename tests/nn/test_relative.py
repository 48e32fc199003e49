"""T5's pieces in attnlab.nn: the relative position buckets (against transformers and by hand),
the bias with a cache, unscaled attention, and the gated GELU feed-forward."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.t5.modeling_t5 import T5Attention

from attnlab.config import GATED
from attnlab.nn import RelativePositionBias, relative_position_bucket, scaled_dot_product_attention
from attnlab.nn.feedforward import GATES, FeedForward

DISTANCES = torch.arange(-300, 301)[None]  # j − i, keys before and after the query


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (8, 12), (64, 200)])
def test_buckets_equal_transformers(bidirectional, buckets, max_distance):
    expected = T5Attention._relative_position_bucket(DISTANCES, bidirectional, buckets,
                                                     max_distance)
    got = relative_position_bucket(DISTANCES, bidirectional, buckets, max_distance)
    assert torch.equal(got, expected)


def bucket(relative: int, bidirectional: bool) -> int:
    return int(relative_position_bucket(torch.tensor(relative), bidirectional, 32, 128))


def test_buckets_by_hand():
    """32 buckets, max distance 128. Encoder: 16 a side, 0..7 exact, then
    8 + ⌊log(d / 8) / log(128 / 8) · 8⌋; keys after the query (j > i) from bucket 16."""
    assert bucket(0, True) == 0
    assert [bucket(-d, True) for d in range(1, 8)] == list(range(1, 8))  # exact
    assert bucket(3, True) == 16 + 3
    assert bucket(-8, True) == 8  # log(1) = 0: the first log bucket
    assert bucket(-20, True) == 8 + math.floor(math.log(20 / 8) / math.log(16) * 8) == 10
    assert bucket(20, True) == 16 + 10
    assert bucket(-100, True) == 8 + 7 == bucket(-127, True)  # log-spaced: wide buckets
    assert bucket(-128, True) == bucket(-5000, True) == 15  # saturated
    assert bucket(5000, True) == 31
    # Decoder (causal): all 32 buckets look back, 0..15 exact; later keys count as 0
    assert bucket(5, False) == 0 and bucket(-5, False) == 5 and bucket(-15, False) == 15
    assert bucket(-20, False) == 16 + math.floor(math.log(20 / 16) / math.log(8) * 16) == 17
    assert bucket(-200, False) == 31


def test_bias_with_a_cache_is_the_rows_of_the_full_bias():
    """Decoding step t (k_len = t + 1 keys, cached and new) sees row t of the full bias."""
    bias = RelativePositionBias(n_heads=3, num_buckets=8, max_distance=6, bidirectional=False)
    full = bias.attention_bias(torch.arange(10), 10)
    assert full.shape == (1, 3, 10, 10)
    for t in range(10):
        step = bias.attention_bias(torch.tensor([t]), t + 1)
        assert torch.equal(step, full[:, :, t : t + 1, : t + 1])
    # the table's entry for each (head, bucket of j − i)
    i, j = 7, 2
    assert torch.equal(full[0, :, i, j], bias.embedding.weight[bucket_of(j - i, bias)])


def bucket_of(relative, bias):
    return relative_position_bucket(torch.tensor(relative), bias.bidirectional,
                                    bias.num_buckets, bias.max_distance)


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_scale_option(need_weights):
    """scale=1 (T5) is softmax(QKᵀ + B)·V, in the explicit and the fused path."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    bias = torch.randn(1, 3, 5, 5, generator=g)
    mask = torch.tensor([True, True, True, False, False])[None, None, None].expand(2, 1, 1, 5)
    scores = (q @ k.transpose(-2, -1) + bias).masked_fill(~mask, float("-inf"))
    expected = scores.softmax(-1) @ v
    out = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=1.0,
                                       need_weights=need_weights)
    out = out[0] if need_weights else out
    assert (out - expected).abs().max() <= 1e-5
    default = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    assert (default - scaled_dot_product_attention(q, k, v, mask=mask, bias=bias,
                                                   scale=0.5)).abs().max() <= 1e-6  # 1/√4


def test_geglu_is_gated_tanh_gelu():
    ffn = FeedForward(8, 12, "geglu", bias=False)
    x = torch.randn(2, 3, 8)
    gate = F.gelu(x @ ffn.w1.weight.T, approximate="tanh")
    expected = (gate * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    assert torch.allclose(ffn(x), expected, atol=1e-6)
    assert set(GATES) == set(GATED)  # every gated activation the config allows has its gate
