"""4-bit weight-only linear layers against float references."""

import pytest
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.generation import generate
from attnlab.models import GPT
from attnlab.nn.quantized import Int4Linear, quantize_int4

BF16 = torch.bfloat16


def _codes(out_features=48, in_features=128, group=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out_features, in_features), generator=g)
    scale = torch.rand(out_features, in_features // group, generator=g) * 0.02 + 1e-3
    minimum = -torch.rand(out_features, in_features // group, generator=g) * 0.2
    return codes, scale, minimum


def test_from_codes_multiplies_by_scale_times_code_plus_minimum():
    codes, scale, minimum = _codes()
    layer = Int4Linear.from_codes(codes, scale, minimum)
    # What the kernel is given: scale and zero = minimum + 8·scale, both rounded to bf16.
    s = scale.to(BF16).double().repeat_interleave(32, 1)
    z = (minimum + 8 * scale).to(BF16).double().repeat_interleave(32, 1)
    w_ref = (codes.double() - 8) * s + z
    exact = codes.double() * scale.double().repeat_interleave(32, 1) + minimum.double(
    ).repeat_interleave(32, 1)
    assert (w_ref - exact).abs().max() < 2e-3  # only the bf16 rounding of scale and zero
    assert torch.allclose(layer.weight.double(), w_ref, atol=2 ** -8 * w_ref.abs().max())
    x = torch.randn(3, 5, 128)
    y = layer(x)
    assert y.shape == (3, 5, 48) and y.dtype == torch.float32
    ref = x.to(BF16).double() @ w_ref.t()
    assert (y.double() - ref).abs().max() <= 2 ** -7 * ref.abs().max()


def test_from_linear_rounds_each_weight_to_its_groups_nearest_level():
    torch.manual_seed(0)
    lin = nn.Linear(96, 48)
    layer = Int4Linear.from_linear(lin)
    groups = lin.weight.detach().view(48, 3, 32)
    half_step = ((groups.amax(-1) - groups.amin(-1)) / 15 / 2).repeat_interleave(32, 1)
    err = (layer.weight.float() - lin.weight.detach()).abs()
    assert (err <= half_step * 1.02 + 2 ** -9 * lin.weight.detach().abs()).all()
    x = torch.randn(7, 96)
    assert torch.allclose(layer(x), x.to(BF16).float() @ layer.weight.float().t()
                          + lin.bias.to(BF16).float(), atol=0.02)


def test_shapes_the_kernel_cannot_tile_are_refused_and_skipped():
    with pytest.raises(ValueError, match=r"Int4Linear\(100 -> 16\): in_features must be"):
        Int4Linear(100, 16)
    with pytest.raises(ValueError, match="out_features of 16"):
        Int4Linear(64, 24)
    model = quantize_int4(nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 24)))
    assert isinstance(model[0], Int4Linear) and isinstance(model[1], nn.Linear)
    assert model[1].weight.dtype == BF16


def test_quantize_int4_gpt_computes_the_float_model_of_its_dequantised_weights():
    """The 4-bit GPT equals a float32 GPT holding the dequantised weights, up to bf16
    activations; 4-bit rounding of N(0, 0.02) weights itself moves the logits by ~10%."""
    torch.manual_seed(0)
    model = GPT(ModelConfig.from_preset("gpt-mini", n_decoder_layers=2)).eval()
    reference = GPT(model.config).eval()
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        original = model(ids)
        q = quantize_int4(model)
        for name, module in q.named_modules():
            if isinstance(module, Int4Linear):
                reference.get_submodule(name).weight.copy_(module.weight.float())
        out, ref = q(ids).float(), reference(ids)
    assert sum(isinstance(m, Int4Linear) for m in q.modules()) == 2 * 4  # qkv, out, w1, w2
    assert isinstance(q.lm_head, nn.Linear) and q.lm_head.weight is q.embed.weight
    assert (out - ref).norm() / ref.norm() < 0.02
    assert (out - original).norm() / original.norm() < 0.2
    cached = generate(q, ids[:, :4], 8)
    with torch.no_grad():  # the same tokens recomputing the whole prefix at every step
        seq = ids[:, :4]
        for _ in range(8):
            seq = torch.cat([seq, q(seq)[:, -1].float().argmax(-1, keepdim=True)], 1)
    assert torch.equal(cached, seq)
