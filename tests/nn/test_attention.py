"""scaled_dot_product_attention: hand-verified numbers and properties."""

import math

import pytest
import torch

from attnlab.nn import causal_mask, scaled_dot_product_attention

Q = torch.tensor([[1.0, 0, 1], [0, 1, 1]])
K = torch.tensor([[1.0, 1, 0], [1, 0, 1]])
V = torch.tensor([[2.0, 0, 1], [1, 1, 0]])


def test_softmax_hand_values():
    # softmax([2, 1, 0.1]) = e^x / Σe^x, worked by hand to 4 places.
    out = torch.tensor([2.0, 1.0, 0.1]).softmax(-1)
    assert torch.allclose(out, torch.tensor([0.6590, 0.2424, 0.0986]), atol=1e-4)


@pytest.mark.parametrize("need_weights", [True, False])
def test_worked_example_forward(need_weights):
    # Row 1: scores [1, 2]/√3 -> weights [0.359, 0.641]; row 2: [1, 1]/√3 -> [0.5, 0.5].
    result = scaled_dot_product_attention(Q[None, None], K[None, None], V[None, None],
                                          need_weights=need_weights)
    expected_out = torch.tensor([[1.359, 0.641, 0.359], [1.5, 0.5, 0.5]])
    if need_weights:
        out, weights = result
        expected_w = torch.tensor([[0.359, 0.641], [0.5, 0.5]])
        assert torch.allclose(weights[0, 0], expected_w, atol=1e-3)
    else:
        out = result
    assert torch.allclose(out[0, 0], expected_out, atol=1e-3)


@pytest.mark.parametrize("need_weights", [True, False])
def test_worked_example_value_gradient(need_weights):
    v = V[None, None].clone().requires_grad_()
    result = scaled_dot_product_attention(Q[None, None], K[None, None], v,
                                          need_weights=need_weights)
    out = result[0] if need_weights else result
    upstream = torch.tensor([[1.0, 0, 1], [0, 1, 0]])
    out.backward(upstream[None, None])
    # dL/dV = Pᵀ · dO
    expected = torch.tensor([[0.359, 0.5, 0.359], [0.641, 0.5, 0.641]])
    assert torch.allclose(v.grad[0, 0], expected, atol=1e-3)


def _qkv(b=2, h=3, lq=5, lk=7, d=8, hk=None, dtype=torch.float32):
    hk = h if hk is None else hk
    return (torch.randn(b, h, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, d, dtype=dtype))


def test_rows_sum_to_one_and_masked_weights_are_exactly_zero():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 7) > 0.4
    mask[..., 0] = True  # no empty rows here
    _, w = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()


MASKS = {
    "none": None,
    "padding": torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :],
    "causal": causal_mask(5, 7),
    "random": torch.rand(2, 3, 5, 7) > 0.5,
}


@pytest.mark.parametrize("name", list(MASKS))
def test_explicit_and_fused_paths_agree(name):
    q, k, v = _qkv()
    mask = MASKS[name]
    fused = scaled_dot_product_attention(q, k, v, mask=mask)
    explicit, _ = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    assert (fused - explicit).abs().max() <= 1e-6


def test_paths_agree_with_bias_causal_and_gqa():
    q, k, v = _qkv(h=4, hk=2, lq=7, lk=7)
    bias = torch.randn(1, 4, 7, 7)
    mask = MASKS["padding"]
    for is_causal in (False, True):
        fused = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
        explicit, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias,
                                                   is_causal=is_causal, need_weights=True)
        assert (fused - explicit).abs().max() <= 1e-6
    assert (w[..., 0, 1:] == 0).all()  # the causal part held


def test_bias_is_added_to_scores():
    q, k, v = _qkv(b=1, h=1, lq=2, lk=3)
    bias = torch.tensor([[0.0, -1.0, 2.0], [3.0, 0.0, 0.0]])
    _, w = scaled_dot_product_attention(q, k, v, bias=bias, need_weights=True)
    scores = q[0, 0] @ k[0, 0].T / math.sqrt(8) + bias
    assert torch.allclose(w[0, 0], scores.softmax(-1), atol=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_row_gives_zeros_and_finite_gradients(need_weights):
    q, k, v = (t.requires_grad_() for t in _qkv(b=1, h=2, lq=3, lk=4))
    mask = torch.tensor([[True, True, False, False], [False] * 4, [True] * 4])
    result = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=need_weights)
    out = result[0] if need_weights else result
    assert torch.isfinite(out).all()
    assert (out[:, :, 1] == 0).all()
    if need_weights:
        assert (result[1][:, :, 1] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_scaling_keeps_unit_variance():
    # q, k with unit-variance components: q·k has variance d_k; dividing by √d_k restores 1.
    d_k, n = 64, 20000
    q, k = torch.randn(n, d_k), torch.randn(n, d_k)
    dots = (q * k).sum(-1)
    assert abs(dots.var().item() / d_k - 1) < 0.05
    assert abs((dots / math.sqrt(d_k)).var().item() - 1) < 0.05
    # and the function applies exactly that scaling
    _, w = scaled_dot_product_attention(q[None, None, :2], k[None, None, :3], k[None, None, :3],
                                        need_weights=True)
    expected = (q[:2] @ k[:3].T / math.sqrt(d_k)).softmax(-1)
    assert torch.allclose(w[0, 0], expected, atol=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_float64(need_weights):
    q, k, v = (t.requires_grad_() for t in _qkv(b=1, h=2, lq=3, lk=4, d=5, dtype=torch.float64))
    mask = torch.tensor([[True, True, False, True], [True, False, False, False], [True] * 4])

    def f(q, k, v):
        r = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=need_weights)
        return r[0] if need_weights else r

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_is_causal_bottom_right_alignment_for_cached_queries():
    q, k, v = _qkv(lq=2, lk=5)
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    # query 0 is position 3 of 5: it sees keys 0..3; query 1 sees all five.
    ref0 = scaled_dot_product_attention(q[:, :, :1], k[:, :, :4], v[:, :, :4])
    ref1 = scaled_dot_product_attention(q[:, :, 1:], k, v)
    assert torch.allclose(out, torch.cat([ref0, ref1], dim=2), atol=1e-6)


@pytest.mark.parametrize("is_causal", [False, True])
def test_bf16_fast_path_matches_torch_kernel(is_causal):
    # On CPU, bf16 short sequences take the composed path (faster there); it must agree with
    # torch's own fused kernel to bf16 precision, masks and causality included.
    q, k, v = (t.bfloat16() for t in _qkv(lq=6, lk=6))
    mask = MASKS["padding"][..., :6]
    ours = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)
    causal = torch.ones(6, 6, dtype=torch.bool).tril() if is_causal else True
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask & causal)
    assert ours.dtype == torch.bfloat16
    assert (ours.float() - ref.float()).abs().max() < 2e-2
