"""4-bit weight-only linear layers against float references."""

import copy

import pytest
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.cpu import kernels as cpu_kernels
from attnlab.cpu.integer import KernelInt4Linear, KernelInt8Linear, integer_kernels_
from attnlab.cpu.linear import fuse_projections_, stack_rows
from attnlab.generation import generate
from attnlab.models import GPT
from attnlab.nn.quantized import (
    Int4Linear,
    float_dtype,
    pack_codes,
    quantize,
    unpack_codes,
)

BF16 = torch.bfloat16


def _codes(out_features=48, in_features=128, group=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out_features, in_features), generator=g)
    scale = torch.rand(out_features, in_features // group, generator=g) * 0.02 + 1e-3
    minimum = -torch.rand(out_features, in_features // group, generator=g) * 0.2
    return codes, scale, minimum


def _int4_error_bound(x, layer):
    """What Int4Linear may differ from x · Ŵᵀ by for a few rows: attnlab's kernel
    (KernelInt4Linear) rounds x to 16 bits per 32 inputs (½ s_x · |s · c| summed,
    attnlab/cpu/kernels.py), PyTorch's (the reference layer's, and the fallback) rounds x and
    its output to bf16."""
    x = x.reshape(-1, layer.in_features).double()
    w = layer.weight.double()
    magnitude = x.abs() @ w.abs().t()
    if not cpu_kernels.available() or not isinstance(layer, KernelInt4Linear):
        return 2 ** -7 * magnitude
    step = (x.view(x.shape[0], -1, 32).abs().amax(-1) / 32767).repeat_interleave(32, 1)
    sc = w - layer.kernel_offsets.double().repeat_interleave(layer.group_size, 1)
    return 0.5 * step @ sc.abs().t() + 2 ** -18 * magnitude


def test_from_codes_multiplies_by_scale_times_code_plus_minimum():
    codes, scale, minimum = _codes()
    layer = KernelInt4Linear.from_codes(codes, scale, minimum)
    # What the layer keeps: scale and zero = minimum + 8·scale, both rounded to bf16; what its
    # kernel reads: that scale and b = zero − 8·scale, rounded to float16.
    s = scale.to(BF16).double()
    z = (minimum + 8 * scale).to(BF16).double()
    b = (z - 8 * s).to(torch.float16).double()
    w_ref = codes.double() * s.to(torch.float16).double().repeat_interleave(32, 1) + \
        b.repeat_interleave(32, 1)
    exact = codes.double() * scale.double().repeat_interleave(32, 1) + minimum.double(
    ).repeat_interleave(32, 1)
    assert (w_ref - exact).abs().max() < 2e-3  # only the rounding of scale and zero
    assert torch.allclose(layer.weight.double(), w_ref, rtol=0, atol=1e-6)  # float32's own
    x = torch.randn(3, 5, 128)
    y = layer(x)
    assert y.shape == (3, 5, 48) and y.dtype == torch.float32
    ref = x.reshape(15, 128).double() @ w_ref.t()
    assert ((y.reshape(15, 48).double() - ref).abs() <= _int4_error_bound(x, layer)).all()


def test_from_linear_rounds_each_weight_to_its_groups_nearest_level():
    torch.manual_seed(0)
    lin = nn.Linear(96, 48)
    layer = KernelInt4Linear.from_linear(lin)
    groups = lin.weight.detach().view(48, 3, 32)
    half_step = ((groups.amax(-1) - groups.amin(-1)) / 15 / 2).repeat_interleave(32, 1)
    err = (layer.weight.float() - lin.weight.detach()).abs()
    assert (err <= half_step * 1.02 + 2 ** -9 * lin.weight.detach().abs()).all()
    x = torch.randn(7, 96)
    with torch.no_grad():
        error = layer(x).double() - (x.double() @ layer.weight.double().t() + lin.bias.double())
    assert (error.abs() <= _int4_error_bound(x, layer) + 1e-6).all()


def test_shapes_the_kernel_cannot_tile_are_refused_and_skipped():
    with pytest.raises(ValueError, match=r"Int4Linear\(100 -> 16\): in_features must be"):
        Int4Linear(100, 16)
    with pytest.raises(ValueError, match="out_features of 16"):
        Int4Linear(64, 24)
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 24))
    quantize(model, bits=4)
    integer_kernels_(model)  # the few rows on attnlab's kernels
    assert isinstance(model[0], Int4Linear) and isinstance(model[1], nn.Linear)
    assert model[1].weight.dtype == float_dtype()  # runs in the CPU's fast float


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
        q = copy.deepcopy(model)
        quantize(q, bits=4)
        integer_kernels_(q)  # the few rows on attnlab's kernels
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


# --- every format's error bound, as nn/quantized.py documents it ----------------------------
def _weights(out_features=48, in_features=128, seed=0):
    """Rows of different scales, one group all positive and one constant, a large outlier."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * torch.logspace(
        -3, 0, out_features)[:, None]
    w[0, :32] = w[0, :32].abs() + 1.0  # far from zero: |z| large against s
    w[1, 32:64] = 0.25  # constant group: s = 0
    w[2, 5] = 40.0
    return w


def test_int8_error_is_at_most_half_a_step_per_channel():
    w = _weights()
    lin = nn.Linear(128, 48)
    lin.weight.data = w
    layer = KernelInt8Linear.from_linear(lin)
    s = w.abs().amax(1) / 127
    assert torch.equal(layer.scales, s)
    err = (layer.weight - w).abs()
    assert (err <= s[:, None] / 2 * (1 + 1e-6)).all()
    assert layer.qweight.dtype == torch.int8 and layer.qweight.abs().max() == 127
    # a few rows: attnlab's kernel in float32 (PyTorch's in bf16 without it); many: a GEMM
    # on Ŵ in float_dtype(); all ≈ x·Ŵᵀ + b
    for rows in (5, 200):
        x = torch.randn(rows, 128)
        ref = x.double() @ layer.weight.double().t() + lin.bias.double()
        err = (layer(x).double() - ref).abs().max()
        exact = cpu_kernels.available() if rows <= 32 else float_dtype() == torch.float32
        tolerance = 2 ** -18 if exact else 2 ** -7
        assert err <= tolerance * (x.abs().double() @ layer.weight.abs().double().t()).max()


def test_int8_passes_a_gradient_to_its_input():
    """A few rows that need a gradient (LoRA over int8 weights) take the float GEMM on Ŵ,
    which has one: ∂(Σ y)/∂x = Σ_o Ŵ[o, :] (in float_dtype())."""
    layer = KernelInt8Linear.from_linear(nn.Linear(40, 16))
    x = torch.randn(3, 40, requires_grad=True)
    layer(x).sum().backward()
    expected = layer.weight.sum(0).expand(3, 40)
    tolerance = 2 ** -7 if float_dtype() == BF16 else 1e-5
    assert torch.allclose(x.grad, expected, rtol=0, atol=tolerance * expected.abs().max())


def test_int8_runs_compiled_and_reloaded_with_the_same_numbers():
    """PyTorch's kernel's bf16 scales are a buffer of their own (inductor cannot lower that
    kernel on a cast made inside the graph): they follow a state_dict into a fresh layer and
    survive a cast of the model. A compiled call runs the eager layer's kernel: attnlab's
    gives the same numbers bit for bit, PyTorch's (fallback) numbers at least as close."""
    lin = nn.Linear(128, 48)
    lin.weight.data = _weights()
    layer = KernelInt8Linear.from_linear(lin)
    again = KernelInt8Linear(128, 48, bias=True)
    again.load_state_dict(layer.state_dict())
    again.to(torch.float64).to(torch.float32)
    assert set(layer.state_dict()) == {"qweight", "scales", "bias"}
    assert again.kernel_scales.dtype == torch.bfloat16
    assert torch.equal(again.kernel_scales, layer.scales.to(torch.bfloat16))
    x = torch.randn(1, 128)
    want = layer(x)
    assert torch.equal(again(x), want)
    torch._dynamo.reset()
    compiled = torch.compile(again, fullgraph=True, dynamic=False)
    ref = x.double() @ layer.weight.double().t() + lin.bias.double()
    bound = 2 ** -7 * (x.abs().double() @ layer.weight.abs().double().t()).max()
    with torch.no_grad():
        got = compiled(x)
    error = (got.double() - ref).abs().max()
    assert error <= bound and error <= (want.double() - ref).abs().max()
    assert torch.equal(got, want) or not cpu_kernels.available()


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 64), (2, 32), (2, 128)])
def test_group_wise_error_is_half_a_step_plus_bf16_rounding(bits, group):
    w = _weights()
    lin = nn.Linear(128, 48, bias=False)
    lin.weight.data = w
    layer = KernelInt4Linear.from_linear(lin, group, bits)
    codes = layer.plain_codes()
    assert codes.min() >= 0 and codes.max() <= 2 ** bits - 1
    groups = w.view(48, 128 // group, group)
    s = ((groups.amax(-1) - groups.amin(-1)) / (2 ** bits - 1)).repeat_interleave(group, 1)
    z = (groups.amin(-1) + 8 * groups.amax(-1).sub(groups.amin(-1)) / (2 ** bits - 1)
         ).repeat_interleave(group, 1)
    bound = s / 2 + 2 ** -8 * (z.abs() + 8 * s + w.abs())  # + the kernel's bf16 output
    err = (layer.weight.float() - w).abs()
    assert (err <= bound).all(), (err - bound).max()
    if group == 32:
        assert (err[1, 32:64] == 0).all()  # a constant group is exact
    # the bound is not loose: half a step is reached, up to rounding
    assert (err / s.clamp(min=1e-30)).max() > 0.45


@pytest.mark.parametrize("bits", [4, 2])
def test_codes_read_back_and_pack_portably(bits):
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 2 ** bits, (32, 64), generator=g)
    scale = torch.rand(32, 2, generator=g) * 0.1 + 0.01
    layer = KernelInt4Linear.from_codes(codes, scale, -scale * 3, bits=bits)
    assert torch.equal(layer.plain_codes(), codes.to(torch.int32))
    packed = pack_codes(codes, bits)
    assert packed.shape == (32, 64 * bits // 8) and packed.dtype == torch.uint8
    # by hand: the first byte holds codes 0 .. 8/bits − 1, the first in the low bits
    first = sum(int(codes[0, j]) << (j * bits) for j in range(8 // bits))
    assert int(packed[0, 0]) == first
    assert torch.equal(unpack_codes(packed, bits), codes.to(torch.int32))
    state = layer.state_dict()
    assert set(state) == {"qweight", "scales", "zeros"} and torch.equal(state["qweight"], packed)
    again = KernelInt4Linear(64, 32, 32, bits=bits)
    again.load_state_dict(state)
    x = torch.randn(3, 64)
    assert torch.equal(again(x), layer(x))


def test_without_attnlabs_kernels_pytorchs_int4_kernel_runs(monkeypatch):
    """Where attnlab's kernels cannot be built, the int4 layer runs PyTorch's kernel (bf16
    activations), packed from the same codes on first use, within bf16's bound of x · Ŵᵀ."""
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    codes, scale, minimum = _codes()
    layer = KernelInt4Linear.from_codes(codes, scale, minimum, bias=torch.randn(48))
    x = torch.randn(4, 128)
    ref = x.double() @ layer.weight.double().t() + layer.bias.double()
    assert ((layer(x).double() - ref).abs() <= _int4_error_bound(x, layer)).all()
    assert layer._pytorch is not None  # PyTorch's packing, made for this call


def test_a_prompt_runs_one_float_gemm_on_the_dequantised_weights():
    codes, scale, minimum = _codes()
    layer = KernelInt4Linear.from_codes(codes, scale, minimum)
    x = torch.randn(40, 128)  # more rows than the kernel takes
    ref = x.to(float_dtype()).double() @ layer.weight.to(float_dtype()).double().t()
    tolerance = 2 ** -7 if float_dtype() == BF16 else 1e-5
    assert torch.allclose(layer(x).double(), ref, rtol=0, atol=tolerance * ref.abs().max())


def test_dynamic_int8_activations_quantise_x_per_call():
    """``quantized::linear_dynamic``: x on an asymmetric 8-bit grid from its own min/max (7-bit
    on x86 without VNNI), an int8 GEMM, float out; within a step of x times the weights' row
    sums of |W|."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    layer = KernelInt8Linear.from_linear(lin, activations="dynamic")
    x = torch.randn(6, 64)
    exact = x @ layer.weight.t() + lin.bias.detach()
    step = float(x.max() - x.min()) / (127 if layer.reduce_range else 255)
    bound = step / 2 * layer.weight.abs().sum(1) + 1e-5
    assert ((layer(x) - exact).abs() <= bound).all()
    assert not torch.equal(layer(x), exact)  # the activations really are quantised


@pytest.mark.parametrize("vnni", ["0", "1"])
def test_dynamic_int8_reduces_range_without_vnni(vnni, monkeypatch):
    """Without VNNI an x86 engine gets 7-bit activations; the bound above holds either way on
    the CPU the tests run on, and the flag follows the CPU's int8 support."""
    monkeypatch.setenv("ATTNLAB_NATIVE_INT8", vnni)
    layer = KernelInt8Linear.from_linear(nn.Linear(8, 4), activations="dynamic")
    x86 = torch.backends.quantized.engine in ("fbgemm", "x86", "onednn")
    assert layer.reduce_range == (x86 and vnni == "0")


# --- stacked projections for decoding (cpu/linear.py's fuse_projections_) ---------------------
def _linears(sizes, in_features=64, bias=True, seed=0):
    torch.manual_seed(seed)
    return [nn.Linear(in_features, n, bias=bias) for n in sizes]


@pytest.mark.parametrize("bits", [4, 8])
def test_stacked_rows_give_each_layers_outputs_side_by_side(bits):
    """Every output row is computed on its own, so the stacked layer's values are the
    layers' own, bit for bit, on the decoding path (a few rows)."""
    make = KernelInt4Linear.from_linear if bits == 4 else KernelInt8Linear.from_linear
    layers = [make(lin) for lin in _linears([64, 32, 32])]
    fused = stack_rows(layers)
    assert type(fused) is type(layers[0]) and fused.out_features == 128
    for rows in (1, 5):
        x = torch.randn(rows, 64)
        got, want = fused(x), torch.cat([m(x) for m in layers], -1)
        # (attnlab's kernels compute each row on its own; PyTorch's fallback is not promised)
        assert torch.equal(got, want) if cpu_kernels.available() else torch.allclose(
            got, want, rtol=1e-3, atol=1e-3)


def test_layers_that_differ_are_not_stacked():
    a, b = _linears([32, 32])
    four, eight = KernelInt4Linear.from_linear(a), KernelInt8Linear.from_linear(b)
    assert stack_rows([four, eight]) is None  # two kinds
    assert stack_rows([a, b]) is None  # float layers: nothing to gain, a float GEMM rounds
    assert stack_rows([four, KernelInt4Linear.from_linear(b, group_size=64)]) is None
    eight_dynamic = KernelInt8Linear.from_linear(b, "dynamic")
    assert stack_rows([KernelInt8Linear.from_linear(a), eight_dynamic]) is None
    assert stack_rows([four, KernelInt4Linear.from_linear(_linears([32], bias=False)[0])]) is None
    from attnlab.nn.lora import LoRALinear

    # no bias attribute of its own
    adapted = LoRALinear(KernelInt4Linear.from_linear(a), r=2, alpha=4)
    assert stack_rows([adapted, four]) is None and stack_rows([four, adapted]) is None


def test_fused_projections_decode_the_same_logits_in_four_products_a_layer():
    """A 4-bit Llama with Q/K/V and W₁/W₃ stacked: the same logits, bit for bit, in 4 integer
    products a layer instead of 7; a float model is left alone."""
    torch.manual_seed(0)
    model = GPT(ModelConfig.from_preset("llama-mini", n_decoder_layers=2, d_ff=384)).eval()
    quantize(model, bits=4)
    integer_kernels_(model)  # the few rows on attnlab's kernels
    ids = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        cache = model.new_cache()
        before = [model(ids, cache=cache)[:, -1]] + [
            model(ids[:, i:i + 1], cache=cache)[:, -1] for i in range(3)]
        fuse_projections_(model)
        cache = model.new_cache()
        after = [model(ids, cache=cache)[:, -1]] + [
            model(ids[:, i:i + 1], cache=cache)[:, -1] for i in range(3)]
    layer = model.blocks.layers[0]
    assert layer.self_attn.fused_qkv and layer.ffn.w1 is None and layer.ffn.w3 is None
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 2 * 4
    exact = cpu_kernels.available()  # (PyTorch's fallback rounds a prompt's GEMM its own way)
    for b, a in zip(before, after, strict=True):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-2)
    float_model = GPT(ModelConfig.from_preset("llama-mini", n_decoder_layers=1))
    fuse_projections_(float_model)
    assert not float_model.blocks.layers[0].self_attn.fused_qkv
