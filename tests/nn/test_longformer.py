"""Longformer attention against the same equation written out densely (an n × n mask built
from the definition, a plain softmax), its memory against the n × n it avoids, and its config."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import ModelConfig
from attnlab.errors import BadInput
from attnlab.models import BERT
from attnlab.nn import scaled_dot_product_attention
from attnlab.nn.longformer import (
    LongformerMask,
    LongformerSelfAttention,
    global_slots,
    sliding_window_attention,
)


def dense_reference(layer: LongformerSelfAttention, x, real, glob):
    """The module docstring's definition, one query at a time over an n × n mask."""
    b, n, _ = x.shape
    h, d = layer.n_heads, layer.d_k

    def heads(t):
        return t.view(b, -1, h, d).transpose(1, 2)

    q, k, v = heads(layer.q_proj(x)), heads(layer.k_proj(x)), heads(layer.v_proj(x))
    qg, kg, vg = heads(layer.q_global(x)), heads(layer.k_global(x)), heads(layer.v_global(x))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    w = layer.window // 2
    out = torch.zeros(b, h, n, d)
    for row in range(b):
        band = ((i - j).abs() <= w) & real[row][None, :] & ~glob[row][None, :]
        local = band | (glob[row] & real[row])[None, :]  # (n, n): the band and the globals
        everything = real[row][None, :].expand(n, n)
        for query in range(n):
            if not real[row, query]:
                continue  # padding: zeros
            g = bool(glob[row, query])
            allowed = everything[query] if g else local[query]
            qq, kk, vv = (qg, kg, vg) if g else (q, k, v)
            scores = torch.einsum("hd,hjd->hj", qq[row, :, query], kk[row]) / d**0.5
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[row, :, query] = torch.einsum("hj,hjd->hd", scores.softmax(-1), vv[row])
    return layer.out_proj(out.transpose(1, 2).reshape(b, n, h * d))


def make_layer(window, d_model=16, heads=2, seed=0):
    torch.manual_seed(seed)
    layer = LongformerSelfAttention(d_model, heads, window).eval()
    for p in layer.parameters():  # biases too: each projection its own numbers
        torch.nn.init.normal_(p, std=0.5)
    return layer


@pytest.mark.parametrize("n,window", [(16, 4), (13, 4), (7, 8), (21, 6), (5, 2)])
def test_band_and_global_tokens_match_the_dense_definition(n, window):
    layer = make_layer(window)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, 16, generator=g)
    real = torch.ones(3, n, dtype=torch.bool)
    real[1, n - 3:] = False  # padding at the end of a row
    real[2, n // 2:] = False
    glob = torch.zeros(3, n, dtype=torch.bool)
    glob[0, [0, n // 2]] = True  # two global tokens, one inside others' bands
    glob[1, 1] = True  # one; row 2 has none (fewer than the batch's most)
    mask = LongformerMask.of(x[..., 0], real, glob)
    with torch.no_grad():
        ours, ref = layer(x, mask=mask), dense_reference(layer, x, real, glob)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_without_global_tokens_is_the_band_alone():
    layer = make_layer(4)
    x = torch.randn(2, 11, 16)
    real = torch.ones(2, 11, dtype=torch.bool)
    glob = torch.zeros_like(real)
    with torch.no_grad():
        ours = layer(x, mask=LongformerMask(real, glob))
        torch.testing.assert_close(ours, dense_reference(layer, x, real, glob),
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(ours, layer(x))  # no mask: every token real, none global


def test_a_window_covering_the_sequence_is_full_attention():
    """W/2 ≥ n and no global token: every query sees every real key (plain softmax)."""
    b, h, n, d = 2, 3, 9, 8
    q, k, v = torch.randn(3, b, h, n, d).unbind(0)
    keys = torch.ones(b, n, dtype=torch.bool)
    keys[1, 6:] = False
    scores = (q @ k.transpose(-1, -2) / d**0.5).masked_fill(~keys[:, None, None, :], -1e30)
    torch.testing.assert_close(sliding_window_attention(q, k, v, keys, 2 * n),
                               scores.softmax(-1) @ v, atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = torch.randn(3, 2, 2, 10, 4).unbind(0)
    keys = torch.ones(2, 10, dtype=torch.bool)
    keys[1] = False  # nothing to attend in row 1
    keys[0, :4] = False  # row 0: queries 0 and 1 have no key within their band of 2 each side
    out = sliding_window_attention(q, k, v, keys, 4)
    assert not out.isnan().any()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[0, :, :2], torch.zeros_like(out[0, :, :2]))
    assert out[0, :, 2:].abs().sum(-1).min() > 0
    layer = make_layer(4)
    padded = LongformerMask(torch.zeros(1, 10, dtype=torch.bool), torch.zeros(1, 10).bool())
    with torch.no_grad():  # an all-padding row: the output projection's bias alone
        y = layer(torch.randn(1, 10, 16), mask=padded)
    torch.testing.assert_close(y, layer.out_proj.bias.expand(1, 10, 16))


def test_global_slots_list_each_rows_global_positions():
    glob = torch.tensor([[0, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    index, valid = global_slots(glob)
    assert index[0].tolist() == [1, 3, 4] and index[2, 0] == 0
    assert valid.tolist() == [[True] * 3, [False] * 3, [True, False, False]]


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operation creates while it is active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_memory_grows_with_n_times_w_never_n_squared():
    n, window, heads = 2048, 16, 2
    layer = make_layer(window, heads=heads)
    x = torch.randn(1, n, 16)
    glob = torch.zeros(1, n, dtype=torch.bool)
    glob[0, [0, 700]] = True
    mask = LongformerMask(torch.ones(1, n, dtype=torch.bool), glob)
    with torch.no_grad(), _LargestTensor() as seen:
        layer(x, mask=mask)
    # a few times the scores, heads · n · (3W/2 + G), or the blocks' keys, heads · 3n · d_k
    bound = 4 * heads * n * (3 * window // 2 + 2)
    assert seen.largest <= bound < n * n
    q = torch.randn(1, heads, 256, 8)
    with torch.no_grad(), _LargestTensor() as dense:  # full attention: the checker sees n × n
        scaled_dot_product_attention(q, q, q, mask=torch.ones(256, 256, dtype=torch.bool),
                                     need_weights=True)
    assert dense.largest >= 256 * 256


def config(**overrides):
    return ModelConfig(**{**dict(arch="encoder", vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                                 n_encoder_layers=2, n_decoder_layers=0, positional="learned",
                                 max_len=64), **overrides})


@pytest.mark.parametrize("window", [3, 0, -2, [4], [4, 5], "4", [4, True], 4.0])
def test_a_bad_window_is_one_line(window):
    with pytest.raises(BadInput, match="attention_window"):
        config(attention_window=window)


def test_windows_only_for_encoders_with_layers_of_their_own():
    with pytest.raises(BadInput, match="attention_window"):
        config(arch="decoder", n_decoder_layers=2, n_encoder_layers=0, attention_window=4)
    with pytest.raises(BadInput, match="Longformer"):
        BERT(config(attention_window=4, share_layers=True))
    with pytest.raises(BadInput, match="Longformer"):
        BERT(config(attention_window=4, positional="rope"))


def test_each_layer_gets_its_window_and_the_property_says_long_documents():
    c = config(attention_window=[4, 8])
    model = BERT(c)
    assert [layer.self_attn.window for layer in model.encoder.layers] == [4, 8]
    assert c.attention_windows == [4, 8] and config(attention_window=6).attention_windows == [6, 6]
    assert c.reads_long_documents and not config().reads_long_documents
    with pytest.raises(BadInput, match="weights"):
        model.encode(torch.randint(4, 50, (1, 6)), need_weights=True)


def test_training_reaches_every_projection_with_finite_gradients():
    layer = make_layer(4).train()
    layer.dropout = 0.1
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, 6:] = False
    glob = torch.zeros_like(real)
    glob[:, 0] = True
    layer(torch.randn(2, 9, 16), mask=LongformerMask(real, glob)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all() and p.grad.abs().sum() > 0, name
