"""attnlab.cpu.linear: the few-row float kernel's layer and stacking it (the rest of
decoding_layout_ is tested with generation, tests/generation/test_generate.py; stack_rows with
the integer layers, tests/nn/test_quantized.py)."""

import os

import pytest
import torch

from attnlab.cpu import kernels as cpu_kernels
from attnlab.cpu.linear import KernelLinear, stack_rows

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason="attnlab's CPU kernels are not built here")


def _pair(bias: bool) -> tuple[torch.nn.Linear, KernelLinear]:
    """An nn.Linear and a KernelLinear with the same weights; widths not multiples of 8."""
    plain = torch.nn.Linear(83, 45, bias=bias)
    layer = torch.nn.Linear(83, 45, bias=bias)
    layer.load_state_dict(plain.state_dict())
    layer.__class__ = KernelLinear
    return plain, layer


@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_run_the_kernel_and_equal_the_float64_product(bias):
    """1 to ``KernelLinear.ROWS`` rows in any leading shape, a non-contiguous x and no rows at
    all: the kernel's own numbers (bit for bit the op called directly), within 1e-5 of the
    float64 product."""
    torch.manual_seed(0)
    plain, layer = _pair(bias)
    exact_layer = torch.nn.Linear(83, 45, bias=bias).double()
    exact_layer.load_state_dict(plain.state_dict())
    cases = [torch.randn(1, 83), torch.randn(2, 3, 83), torch.randn(KernelLinear.ROWS, 83),
             torch.randn(1, 1, 1, 83), torch.randn(83, 4).t(), torch.randn(0, 83)]
    for x in cases:
        with torch.no_grad():
            got = layer(x)
            kernel = torch.ops.attnlab.float_matmul(x.reshape(-1, 83).contiguous(),
                                                    layer.weight, layer.bias)
            exact = exact_layer(x.double()).float()
        assert got.shape == exact.shape == (*x.shape[:-1], 45)
        assert torch.equal(got, kernel.view(got.shape))
        assert torch.allclose(got, exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_row_in_a_batch_gets_the_bits_it_gets_alone(dtype):
    """The kernel takes blocks of rows of x against blocks of weight rows (2 x 4 in 16-lane
    registers on AVX-512, 2 x 1 in 8-lane ones on AVX2, fewer at the edges); each row's sums
    still run in the one-row order, so a batched step decodes the same bits as each
    sequence alone (what serving's batched answers rest on): 1 to ``KernelLinear.ROWS`` rows
    (every remainder of the blocks), widths with every tail (32-wide blocks, 8-wide ones,
    single inputs), x float32 and, for 16-bit weights, x of the weight's dtype."""
    torch.manual_seed(0)
    for k in (83, 576, 7):
        w = torch.randn(37, k).to(dtype)
        b = torch.randn(37)
        most = KernelLinear.ROWS
        xs = [torch.randn(most, k)] + ([torch.randn(most, k).to(dtype)]
                                       if dtype != torch.float32 else [])
        for x8 in xs:
            bias = b.to(x8.dtype)
            for m in range(1, most + 1):
                x = x8[:m].contiguous()
                batch = torch.ops.attnlab.float_matmul(x, w, bias)
                alone = torch.cat([torch.ops.attnlab.float_matmul(x[i : i + 1], w, bias)
                                   for i in range(m)])
                assert torch.equal(batch, alone), (k, m, x.dtype)
                exact = (x.double() @ w.double().t() + bias.double()).to(x.dtype)
                tol = 1e-5 if x.dtype == torch.float32 else 2e-2
                assert torch.allclose(batch, exact, atol=tol * k ** 0.5, rtol=tol)


@pytest.mark.parametrize("bias", [True, False])
def test_everything_else_is_nn_linears_own_product(bias):
    """More rows than the kernel takes, a gradient to pass (of x, or of the bias alone),
    CPU autocast, and x of another dtype than the weight: nn.Linear's bits and autograd."""
    torch.manual_seed(0)
    plain, layer = _pair(bias)
    x = torch.randn(KernelLinear.ROWS + 1, 83)
    with torch.no_grad():
        assert torch.equal(layer(x), plain(x))
    x = torch.randn(2, 83, requires_grad=True)
    layer(x).sum().backward()
    assert torch.allclose(x.grad, plain.weight.sum(0).expand(2, -1), atol=1e-6)
    if bias:  # a frozen weight with a trained bias: the bias still gets its gradient
        layer.weight.requires_grad_(False)
        layer.bias.grad = None
        layer(torch.randn(2, 83)).sum().backward()
        assert torch.equal(layer.bias.grad, torch.full((45,), 2.0))
        layer.weight.requires_grad_(True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer(x), plain(x)) and layer(x).dtype == torch.bfloat16
    layer.to(torch.bfloat16)
    with torch.no_grad(), pytest.raises(RuntimeError):  # nn.Linear's own dtype error
        layer(x.half())
    # float32 x, bf16 W, many rows: x rounded, a bf16 GEMM, widened
    many = torch.randn(KernelLinear.ROWS + 1, 83)
    with torch.no_grad():
        got = layer(many)
        assert got.dtype == torch.float32
        assert torch.equal(got, plain.to(torch.bfloat16)(many.bfloat16()).float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_a_16_bit_layer_runs_the_kernel_and_rounds_once(dtype, bias):
    """x, W and b in bf16 (or fp16): the kernel widens them exactly and sums in float32, so the
    output is the float64 product of the same values rounded once to the dtype: within its
    unit roundoff (2⁻⁸ bf16, 2⁻¹¹ fp16) plus float32's sums; nn.Linear's own 16-bit product
    agrees to within a step or two. The op takes x and b in the dtype (y in it too) or in
    float32, the same sums either way. More rows: nn.Linear's own bits."""
    torch.manual_seed(0)
    plain, layer = _pair(bias)
    plain, layer = plain.to(dtype), layer.to(dtype)
    x = torch.randn(2, 3, 83).to(dtype)
    with torch.no_grad():
        got = layer(x)
        b = None if layer.bias is None else layer.bias.float()
        kernel = torch.ops.attnlab.float_matmul(x.reshape(-1, 83), layer.weight, layer.bias)
        widened = torch.ops.attnlab.float_matmul(x.reshape(-1, 83).float(), layer.weight, b)
        exact = x.double() @ layer.weight.double().t() + (0 if b is None else b.double())
        theirs = plain(x)
    assert got.dtype == kernel.dtype == dtype and got.shape == (2, 3, 45)
    assert widened.dtype == torch.float32
    assert torch.equal(got, kernel.view(2, 3, 45))
    assert torch.equal(kernel, widened.to(dtype))
    unit = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
    assert ((got.double() - exact).abs() <= unit * exact.abs() + 1e-5).all()
    torch.testing.assert_close(got.float(), theirs.float(), rtol=4 * unit, atol=4 * unit)
    many = torch.randn(KernelLinear.ROWS + 1, 83).to(dtype)
    with torch.no_grad():
        assert torch.equal(layer(many), plain(many))


def test_the_float_kernel_refuses_mixed_16_bit_inputs():
    """x, and the bias, are float32 or the weight's own dtype: one error otherwise."""
    w = torch.randn(4, 8).bfloat16()
    for x, b in ((torch.randn(1, 8).half(), None), (torch.randn(1, 8).double(), None),
                 (torch.randn(1, 8).bfloat16(), torch.randn(4).half())):
        with pytest.raises(RuntimeError, match="attnlab float kernel"):
            torch.ops.attnlab.float_matmul(x, w, b)
    with pytest.raises(RuntimeError, match="attnlab float kernel"):
        torch.ops.attnlab.float_matmul(torch.randn(1, 8).bfloat16(), w.float(), None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_float_kernel_widens_16_bit_weights(dtype):
    """float16 and bfloat16 weights, widened to float32 as they are read, against the float64
    product of the same (rounded) weights."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 83), torch.randn(45, 83).to(dtype), torch.randn(45)
    got = torch.ops.attnlab.float_matmul(x, w, b)
    exact = (x.double() @ w.double().t() + b.double()).float()
    assert torch.allclose(got, exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [19, 83, 100, 200])  # (the 64- and 32-wide steps, the tail)
def test_bf16_batch_matmul_multiplies_x_rounded_to_bf16_where_it_runs_vdpbf16ps(k):
    """``bf16_batch_matmul``: where the kernels run AVX512-BF16 (``bf16_dot_rows()``), the
    float64 product of x rounded to bf16 and the bf16 W within float32's sums, the bias added
    in float32, each row's result bit for bit the same whatever rows come with it, and y
    rounded once for bf16 x; elsewhere (``make test-avx2``) exactly ``float_matmul``, float32 x.
    ``float_matmul`` never rounds x."""
    torch.manual_seed(0)
    w, b = torch.randn(45, k).bfloat16(), torch.randn(45)
    x = torch.randn(9, k)
    dot = cpu_kernels.bf16_dot_rows()
    for rows in range(1, 10):
        part = x[:rows].contiguous()
        got = torch.ops.attnlab.bf16_batch_matmul(part, w, b)
        plain = torch.ops.attnlab.float_matmul(part, w, b)
        rounded = part.bfloat16().double() @ w.double().t() + b.double()
        exact = part.double() @ w.double().t() + b.double()
        torch.testing.assert_close(plain.double(), exact, rtol=1e-5, atol=1e-5)
        if dot is None:
            assert torch.equal(got, plain)
            continue
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), rounded, rtol=1e-5, atol=1e-5)
        # (float32 x differs by bf16's rounding of x, far more than 1e-5)
        assert not torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-5)
    if dot is not None:
        eight = torch.ops.attnlab.bf16_batch_matmul(x[:8].contiguous(), w, b)
        for start in (0, 3, 4):  # the same rows in other blocks of 4
            five = torch.ops.attnlab.bf16_batch_matmul(x[start:start + 5].contiguous(), w, b)
            assert torch.equal(five[: 8 - start], eight[start:start + 5])
        ours = torch.ops.attnlab.bf16_batch_matmul(x[:6].bfloat16(), w, b.bfloat16())
        widened = torch.ops.attnlab.bf16_batch_matmul(x[:6].bfloat16().float(), w,
                                                      b.bfloat16())
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, widened.bfloat16())
    with pytest.raises(RuntimeError, match="bfloat16 weight"):
        torch.ops.attnlab.bf16_batch_matmul(x, w.float(), None)


def test_a_bf16_kernel_layer_takes_vdpbf16ps_for_one_token_of_4_or_more_sequences():
    """(batch, 1, in) with batch ≥ bf16_dot_rows(): x rounded to bf16; 1–3 sequences, the
    tokens of one sequence (a prompt, a verification) and any 2-D x, float32 x. Where the CPU
    lists AVX512-BF16 and ATen runs AVX-512, the kernels are built with it."""
    from attnlab import hardware

    torch.manual_seed(0)
    _, layer = _pair(True)
    layer = layer.bfloat16()
    dot = cpu_kernels.bf16_dot_rows()
    on = (torch.backends.cpu.get_cpu_capability() == "AVX512"
          and "avx512_bf16" in hardware.cpu_flags()[1]
          and "0" not in (os.environ.get("ATTNLAB_NATIVE_BF16"), os.environ.get("ATTNLAB_DPBF16")))
    assert dot == (cpu_kernels.BF16_DOT_ROWS if on else None)
    ops = torch.ops.attnlab
    for shape, batch in (((8, 1, 83), True), ((4, 1, 83), True), ((3, 1, 83), False),
                         ((1, 6, 83), False), ((2, 4, 83), False), ((5, 83), False),
                         ((3, 83), False)):
        x = torch.randn(shape)
        with torch.no_grad():
            got = layer(x)
        rows = x.reshape(-1, 83).contiguous()
        product = ops.bf16_batch_matmul if batch and dot is not None else ops.float_matmul
        assert torch.equal(got, product(rows, layer.weight, layer.bias).view(got.shape)), shape


def test_speculative_verification_of_a_bf16_model_keeps_float32_activations():
    """The head of a verification sees 5 tokens of one sequence as a 2-D (5, d): float32 x,
    so its logits are the one-token steps' within float32's rounding (vdpbf16ps would move
    them by bf16's, about 1e-3 here)."""
    import copy

    from attnlab.config import ModelConfig
    from attnlab.cpu import for_decoding
    from attnlab.generation.speculative import _logits
    from attnlab.models import GPT

    torch.manual_seed(0)
    config = ModelConfig.from_preset("llama-mini", n_decoder_layers=2, d_ff=96)
    model = for_decoding(GPT(config).eval(), "cpu", "bf16")
    ids = torch.randint(0, config.vocab_size, (1, 9))
    with torch.no_grad():
        cache = model.new_cache()
        model(ids[:, :4], cache=cache)
        stepped = copy.deepcopy(cache)
        verified = _logits(model, ids[:, 4:], cache, 5)
        steps = torch.cat([model(ids[:, i:i + 1], cache=stepped)[0, -1:].float()
                           for i in range(4, 9)])
    assert verified.shape == steps.shape == (5, config.vocab_size)
    assert (verified - steps).abs().max() <= 1e-5 * steps.abs().max()


def test_vdpbf16ps_is_built_only_for_a_cpu_with_avx512_bf16_unless_turned_off(monkeypatch):
    """The build flag follows ATen's capability and the CPU's flags; ``ATTNLAB_NATIVE_BF16=0``
    (with ``ATEN_CPU_CAPABILITY=avx2``, a CPU without it) and ``ATTNLAB_DPBF16=0`` drop it."""
    from attnlab import hardware

    def flags(capability: str, listed: bool, **env: str) -> list[str]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        cpu = {"avx2", "avx512f"} | ({"avx512_bf16"} if listed else set())
        monkeypatch.setattr(hardware, "cpu_flags", lambda: ("Test CPU", frozenset(cpu)))
        for name in ("ATTNLAB_NATIVE_BF16", "ATTNLAB_DPBF16"):
            if name in env:
                monkeypatch.setenv(name, env[name])
            else:
                monkeypatch.delenv(name, raising=False)
        return cpu_kernels._flags()[0]

    flag = cpu_kernels._DPBF16
    assert flag in flags("AVX512", True)
    assert flag in flags("AVX512", True, ATTNLAB_NATIVE_BF16="1")
    assert flag not in flags("AVX512", True, ATTNLAB_NATIVE_BF16="0")
    assert flag not in flags("AVX512", True, ATTNLAB_DPBF16="0")
    assert flag not in flags("AVX512", False)
    assert flag not in flags("AVX2", True)
    wide = cpu_kernels._WIDE  # the batched float product's AVX-512VL blocks: ATen's AVX-512
    assert wide in flags("AVX512", False) and wide not in flags("AVX2", True)
    assert "-mavx2" in flags("AVX2", True)


# --- stacked float projections (fuse_projections_ over KernelLinear) -------------------------
def _kernel_layers(sizes, bias: bool, in_features: int = 83) -> list[KernelLinear]:
    layers = [torch.nn.Linear(in_features, n, bias=bias) for n in sizes]
    for m in layers:
        m.__class__ = KernelLinear
    return layers


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_kernel_layers_give_each_layers_outputs_bit_for_bit(bias):
    """Each output row is its own sum in the kernel, so the stacked layer's few-row outputs are
    the layers' own, bit for bit; more rows take nn.Linear's GEMM (the same up to rounding)."""
    torch.manual_seed(0)
    layers = _kernel_layers([45, 13, 13], bias)
    fused = stack_rows(layers)
    assert type(fused) is KernelLinear and fused.weight.shape == (71, 83)
    assert (fused.bias is None) == (not bias) and fused.weight.is_contiguous()
    with torch.no_grad():
        for x in (torch.randn(1, 83), torch.randn(2, 3, 83), torch.randn(8, 83)):
            assert torch.equal(fused(x), torch.cat([m(x) for m in layers], -1))
        x = torch.randn(40, 83)
        torch.testing.assert_close(fused(x), torch.cat([m(x) for m in layers], -1))


def test_kernel_layers_that_cannot_share_a_product_are_not_stacked():
    a, b = _kernel_layers([16, 16], bias=False)
    (c,) = _kernel_layers([16], bias=True)
    (d,) = _kernel_layers([16], bias=False, in_features=40)
    assert stack_rows([a, c]) is None  # a bias on one only
    assert stack_rows([a, d]) is None  # another input width
    assert stack_rows([a, torch.nn.Linear(83, 16, bias=False)]) is None  # another kind
    assert stack_rows([a.bfloat16(), b.half()]) is None  # two dtypes
    assert stack_rows([a.double(), b.double()]) is None  # a dtype the kernel does not read
    stacked = stack_rows([a.bfloat16(), b.bfloat16()])
    assert stacked.weight.dtype == torch.bfloat16
    x = torch.randn(1, 83).bfloat16()
    with torch.no_grad():
        assert torch.equal(stacked(x), torch.cat([a(x), b(x)], -1))


def test_for_decoding_stacks_a_float_llamas_projections_and_decodes_the_same_logits():
    """fp32 for_decoding: 4 kernel products a layer instead of 7 (one qkv, one w13), the
    prompt's and each cached step's logits bit for bit those of the unstacked layout."""
    from attnlab.config import ModelConfig
    from attnlab.cpu import for_decoding
    from attnlab.cpu.attention import attention_kernel_
    from attnlab.cpu.linear import decoding_layout_
    from attnlab.models import GPT

    torch.manual_seed(0)
    config = ModelConfig.from_preset("llama-mini", n_decoder_layers=2, d_ff=96)
    model = GPT(config).eval()
    plain = attention_kernel_(decoding_layout_(GPT(config).eval()))  # only stacking differs
    plain.load_state_dict(model.state_dict())
    model = for_decoding(model, "cpu", "fp32")
    layer = model.blocks.layers[0]
    assert layer.self_attn.fused_qkv and layer.ffn.w1 is None and layer.ffn.w3 is None
    assert isinstance(layer.self_attn.qkv, KernelLinear)
    assert isinstance(layer.ffn.w13, KernelLinear)
    assert not layer.self_attn.qkv.training and not layer.ffn.w13.training  # as the model
    ids = torch.randint(0, config.vocab_size, (1, 6))
    with torch.no_grad():
        logits = {}
        for name, m in (("stacked", model), ("plain", plain)):
            cache = m.new_cache()
            logits[name] = [m(ids, cache=cache)[:, -1]] + [
                m(ids[:, i:i + 1], cache=cache)[:, -1] for i in range(4)]
    for a, b in zip(logits["stacked"], logits["plain"], strict=True):
        assert torch.equal(a, b)


def test_a_bf16_llama_decodes_with_bf16_matrices_and_float32_activations():
    """bf16 for_decoding (``--precision bf16``) on the kernel: every linear a bf16
    KernelLinear, Q/K/V and W₁/W₃ stacked, the token embedding's table bf16 (tied or not) and
    everything else float32, so the rows, the KV cache and the logits are float32. Only the
    weights are rounded: each step's logits (the prompt's 3 or 6 rows on the kernel, 9 rows on
    a bf16 GEMM, then cached steps) are those of the same bf16 weights in float64 to float32's
    sums (1e-4 of the largest logit), not a few bf16 steps (1%) as with bf16 activations."""
    import copy

    from attnlab.config import ModelConfig
    from attnlab.cpu import for_decoding
    from attnlab.models import GPT

    torch.manual_seed(0)
    config = ModelConfig.from_preset("llama-mini", n_decoder_layers=2, d_ff=96)
    model = GPT(config).eval()
    exact = copy.deepcopy(model)
    for m in exact.modules():  # the same rounded matrices, the rest as it was, in float64
        if isinstance(m, torch.nn.Linear) or m is exact.embed:
            m.weight.data = m.weight.data.bfloat16()
    exact = exact.double()
    model = for_decoding(model, "cpu", "bf16")
    layer = model.blocks.layers[0]
    assert isinstance(layer.self_attn.qkv, KernelLinear) and isinstance(layer.ffn.w13, KernelLinear)
    assert layer.self_attn.qkv.weight.dtype == torch.bfloat16
    assert model.embed.weight.dtype == model.lm_head.weight.dtype == torch.bfloat16
    assert {p.dtype for n, p in model.named_parameters() if "norm" in n} == {torch.float32}
    ids = torch.randint(0, config.vocab_size, (1, 13))
    for prompt in (3, 6, 9):
        logits = {}
        with torch.no_grad():
            for name, m in (("kernel", model), ("exact", exact)):
                cache = m.new_cache()
                first = m(ids[:, :prompt], cache=cache)[0, -1:]
                steps = [m(ids[:, i:i + 1], cache=cache)[0, -1:] for i in range(prompt, 13)]
                logits[name] = torch.cat([first] + steps)
                if name == "kernel":
                    assert logits[name].dtype == cache[0].k.dtype == torch.float32
        ours = (logits["kernel"].double() - logits["exact"]).abs().max()
        scale = logits["exact"].abs().max()
        # the 9-row prompt rounds x to bf16 for its GEMM: a bf16 step there, float32 after
        bound = (0.01 if prompt == 9 else 1e-4) * scale
        assert ours <= bound, (prompt, ours, scale)


@pytest.mark.parametrize("flags", [[cpu_kernels._DPBF16], [cpu_kernels._WIDE],
                                   [cpu_kernels._WIDE, cpu_kernels._DPBF16]])
def test_a_build_that_fails_with_vdpbf16ps_is_retried_without_it(monkeypatch, flags):
    """An assembler or compiler that cannot build the AVX-512 code (AVX512-BF16's product, the
    wide float blocks) must not take the other kernels with it: the build runs again without
    those flags, and that is said (its FAILED file would otherwise keep it off silently); a
    second failure is said once."""
    calls = []

    def build(cflags, ldflags, fails_without=False):
        calls.append(list(cflags))
        return ("no AVX512-BF16 here" if any(f in cflags for f in flags) or fails_without
                else True)

    monkeypatch.setattr(cpu_kernels, "_flags", lambda: (["-O3", *flags], []))
    monkeypatch.setattr(cpu_kernels, "_DOT_ROWS", cpu_kernels._DOT_ROWS)  # (restored after)
    monkeypatch.setattr(cpu_kernels, "_build", build)
    with pytest.warns(RuntimeWarning) as said:
        assert cpu_kernels._load() is True and calls == [["-O3", *flags], ["-O3"]]
    assert [str(w.message) for w in said] == [
        "attnlab's AVX-512 kernels could not be built (no AVX512-BF16 here); a step of several "
        "sequences runs the AVX2 ones (bf16 with float32 activations), slower"]
    calls.clear()
    monkeypatch.setattr(cpu_kernels, "_build", lambda c, ld: build(c, ld, fails_without=True))
    with pytest.warns(RuntimeWarning) as said:
        assert cpu_kernels._load() is False
    assert calls == [["-O3", *flags], ["-O3"]] and len(said) == 1
    assert "could not be built (no AVX512-BF16 here)" in str(said[0].message)
