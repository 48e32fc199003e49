"""LoRA and bottleneck adapters: the formulas by hand, identity at the start, exact merge and
unmerge, and only the adapters training."""

import dataclasses

import pytest
import torch
from torch import nn

from attnlab.build import build_model, count_parameters
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.peft import adapt, adapter_spec
from attnlab.nn.adapters import adapters, fold_lora, merge, trainable_state, unmerge
from attnlab.nn.bottleneck import BottleneckAdapter
from attnlab.nn.lora import LoRALinear


def _linear(seed=0, d_in=12, d_out=10):
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out)


def test_lora_is_the_formula_and_starts_as_the_identity():
    base = _linear()
    x = torch.randn(3, 5, 12)
    lora = LoRALinear(base, r=4, alpha=8)
    assert torch.equal(lora(x), base(x))  # B = 0
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    a, b = lora.lora_A.weight, lora.lora_B.weight
    expected = x @ base.weight.T + base.bias + (8 / 4) * (x @ a.T @ b.T)
    torch.testing.assert_close(lora(x), expected, atol=1e-5, rtol=1e-5)
    assert not base.weight.requires_grad and a.requires_grad and b.requires_grad


def test_lora_dropout_is_on_the_update_only():
    base = _linear()
    lora = LoRALinear(base, r=4, alpha=4, dropout=0.5).train()
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    x = torch.randn(4, 12)
    torch.manual_seed(1)
    got = lora(x)
    torch.manual_seed(1)
    dropped = nn.functional.dropout(x, 0.5, training=True)
    expected = base(x) + lora.lora_B(lora.lora_A(dropped))
    torch.testing.assert_close(got, expected)


def test_merge_then_unmerge_restores_the_weights_exactly():
    base = _linear()
    before = base.weight.detach().clone()
    lora = LoRALinear(base, r=3, alpha=7)
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    x = torch.randn(6, 12)
    unmerged_out = lora(x)
    lora.merge()
    torch.testing.assert_close(lora(x), unmerged_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(base.weight.detach(), before + lora.delta(), atol=1e-6, rtol=0)
    lora.unmerge()
    assert torch.equal(base.weight, before)
    assert torch.equal(lora(x), unmerged_out)


def test_bottleneck_is_the_formula_and_starts_as_the_identity():
    base = _linear()
    x = torch.randn(2, 7, 12)
    adapter = BottleneckAdapter(base, size=4)
    assert torch.equal(adapter(x), base(x))
    with torch.no_grad():
        adapter.adapter_up.weight.normal_()
        adapter.adapter_up.bias.normal_()
    y = base(x)
    down, up = adapter.adapter_down, adapter.adapter_up
    expected = y + torch.relu(y @ down.weight.T + down.bias) @ up.weight.T + up.bias
    torch.testing.assert_close(adapter(x), expected)
    assert sum(p.numel() for p in adapter.parameters() if p.requires_grad) == 2 * 4 * 10 + 4 + 10


@pytest.fixture(scope="module")
def translator_config():
    return ModelConfig.from_preset("tiny", dropout=0.0, attention_dropout=0.0)


@pytest.mark.parametrize("method", ["lora", "bottleneck"])
def test_an_adapted_encoder_decoder_starts_unchanged_and_trains_only_its_adapters(
        translator_config, method):
    torch.manual_seed(0)
    model = build_model(translator_config).eval()
    src = torch.randint(4, translator_config.vocab_size, (2, 6))
    tgt = torch.randint(4, translator_config.vocab_size, (2, 5))
    before = model(src, tgt)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapt(model, adapter_spec(model, method, r=4, size=8))
    assert torch.equal(model(src, tgt), before)
    expected = {"lora": ("self_attn.q_proj", "cross_attn.v_proj"),
                "bottleneck": ("self_attn.out_proj", "ffn.w2")}[method]
    assert all(any(path.endswith(e) for path in adapters(model)) for e in expected)
    names = set(trainable_state(model))
    assert names and all((".lora_" in n) or (".adapter_" in n) for n in names)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    model(src, tgt).logsumexp(-1).mean().backward()
    optimizer.step()
    assert len(optimizer.state) == len(names)
    for name, p in model.named_parameters():  # the base weights are where they were
        if name.replace(".base.", ".") in frozen and ".base." in name:
            assert torch.equal(p, frozen[name.replace(".base.", ".")])
    # the config records the adapters: the model rebuilds with the same shapes and count
    rebuilt = build_model(model.config)
    assert rebuilt.state_dict().keys() == model.state_dict().keys()
    assert count_parameters(model.config) == sum(p.numel() for p in model.parameters())


def test_fold_gives_the_plain_model_with_the_same_outputs(translator_config):
    torch.manual_seed(0)
    model = build_model(translator_config).eval()
    adapt(model, adapter_spec(model, r=4, targets=["q", "k", "v", "o", "w1", "w2"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    src = torch.randint(4, translator_config.vocab_size, (2, 6))
    tgt = torch.randint(4, translator_config.vocab_size, (2, 5))
    adapted = model(src, tgt)
    merge(model)
    torch.testing.assert_close(model(src, tgt), adapted, atol=1e-5, rtol=1e-5)
    unmerge(model)
    assert not fold_lora(model)
    assert not adapters(model)
    torch.testing.assert_close(model(src, tgt), adapted, atol=1e-5, rtol=1e-5)


def test_bad_adapter_specs_are_named(translator_config):
    model = build_model(translator_config)
    with pytest.raises(BadInput, match="no linear layer of the model matches the targets nope"):
        adapter_spec(model, targets=["nope"])
    for bad, says in [({"method": "prefix", "modules": ["x"]}, "method='prefix'"),
                      ({"method": "lora", "r": 0, "alpha": 1, "modules": ["x"]}, "r must be"),
                      ({"method": "lora", "r": 2, "alpha": 1, "modules": []}, "no layer"),
                      ({"method": "lora", "r": 2, "alpha": 1, "modules": ["x"]},
                       "has no linear layer 'x'")]:
        with pytest.raises(BadInput, match=says):
            build_model(dataclasses.replace(translator_config, adapter=bad))


def test_lora_over_int4_trains_with_the_gradient_of_the_dequantised_weight():
    """QLoRA: the 4-bit base passes the gradient ∂L/∂x = ∂L/∂y · Ŵ to the layers below, and
    A and B get the gradient they would get over a float layer holding Ŵ."""
    from attnlab.nn.quantized import Int4Linear

    torch.manual_seed(0)
    base = Int4Linear.from_linear(nn.Linear(64, 32))
    lora = LoRALinear(base, r=4, alpha=8)
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    w_hat = base.weight.float()  # Ŵ, what the kernel multiplies by
    x = torch.randn(5, 64, requires_grad=True)
    lora(x).square().sum().backward()
    got = (x.grad.clone(), lora.lora_A.weight.grad.clone(), lora.lora_B.weight.grad.clone())
    x_ref = x.detach().clone().requires_grad_()
    a = lora.lora_A.weight.detach().clone().requires_grad_()
    b = lora.lora_B.weight.detach().clone().requires_grad_()
    y = x_ref @ w_hat.T + base.bias.float() + 2.0 * (x_ref @ a.T @ b.T)
    y.square().sum().backward()
    for g, ref in zip(got, (x_ref.grad, a.grad, b.grad), strict=True):
        assert (g - ref).abs().max() <= 0.02 * ref.abs().max()  # bf16 kernels
    assert not any(p.requires_grad for p in base.parameters())


def test_lora_over_int4_is_kept_apart_not_folded_into_a_copy():
    """An integer layer's ``weight`` is a dequantised copy: merging or folding into it would
    drop the update. ``merge`` refuses, and ``fold_lora`` leaves the LoRA path in place, so
    an adapted 4-bit model computes the same before and after folding."""
    from attnlab.nn.adapters import fold_lora
    from attnlab.nn.quantized import Int4Linear

    torch.manual_seed(0)
    model = nn.Sequential(Int4Linear.from_linear(nn.Linear(64, 32)), nn.Linear(32, 32))
    model[0] = LoRALinear(model[0], r=4, alpha=8)
    model[1] = LoRALinear(model[1], r=4, alpha=8)
    with torch.no_grad():
        for layer in model:
            layer.lora_B.weight.normal_()
    x = torch.randn(5, 64)
    with torch.no_grad():
        before = model(x)
        plain = model[0].base(x)
    with pytest.raises(ValueError, match="no float weight"):
        model[0].merge()
    assert fold_lora(model)  # a layer remains adapted
    assert isinstance(model[0], LoRALinear) and isinstance(model[1], nn.Linear)
    with torch.no_grad():
        after = model(x)
    assert (after - before).abs().max() <= 1e-5 * before.abs().max()
    assert (model[0](x) - plain).abs().max() > 0.1  # the update is there

