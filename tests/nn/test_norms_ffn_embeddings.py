import math

import torch
import torch.nn.functional as F

from attnlab.nn import FeedForward, LayerNorm, Residual, RMSNorm, TokenEmbedding


def test_layernorm_hand_values():
    # mean 5, variance 5: (x − 5)/√5 = [−1.3416, −0.4472, 0.4472, 1.3416]
    out = LayerNorm(4)(torch.tensor([2.0, 4, 6, 8]))
    assert torch.allclose(out, torch.tensor([-1.3416, -0.4472, 0.4472, 1.3416]), atol=1e-4)


def test_rmsnorm_formula():
    norm = RMSNorm(4, eps=0.0)
    norm.weight.data = torch.tensor([1.0, 2.0, 1.0, 1.0])
    x = torch.tensor([2.0, 4, 6, 8])
    rms = math.sqrt((4 + 16 + 36 + 64) / 4)
    assert torch.allclose(norm(x), x / rms * norm.weight.data, atol=1e-6)


def test_residual_placements():
    norm = LayerNorm(4)
    x = torch.randn(3, 4)
    f = torch.nn.Linear(4, 4)
    post = Residual(norm, 0.0, pre_norm=False)(x, f)
    pre = Residual(norm, 0.0, pre_norm=True)(x, f)
    assert torch.allclose(post, norm(x + f(x)))
    assert torch.allclose(pre, x + f(norm(x)))


def test_feedforward_variants():
    x = torch.randn(2, 3, 8)
    relu = FeedForward(8, 16, "relu")
    assert torch.allclose(relu(x), relu.w2(torch.relu(relu.w1(x))), atol=1e-6)
    gelu = FeedForward(8, 16, "gelu")
    assert torch.allclose(gelu(x), gelu.w2(F.gelu(gelu.w1(x))), atol=1e-6)
    swiglu = FeedForward(8, 16, "swiglu", bias=False)
    expected = swiglu.w2(F.silu(swiglu.w1(x)) * swiglu.w3(x))
    assert torch.allclose(swiglu(x), expected, atol=1e-6) and swiglu.w1.bias is None


def test_token_embedding_scaled_by_sqrt_d():
    emb = TokenEmbedding(10, 16)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(emb(ids), emb.weight[ids] * 4.0)
    assert torch.allclose(TokenEmbedding(10, 16, scale_by_sqrt_d=False)(ids).std(),
                          torch.tensor(0.25), atol=0.15)


def test_token_embedding_rejects_out_of_range_ids():
    emb = TokenEmbedding(10, 4)
    try:
        emb(torch.tensor([[3, 10]]))
    except ValueError as e:
        assert "[0, 10)" in str(e)
    else:
        raise AssertionError("no error for id 10 in a vocabulary of 10")
