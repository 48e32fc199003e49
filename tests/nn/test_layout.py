"""attnlab.nn.layout: the few-row float kernel's layer (the rest of decoding_layout_ is tested
with generation, tests/generation/test_generate.py; stack_rows with the integer layers,
tests/nn/test_quantized.py)."""

import pytest
import torch

from attnlab.nn import cpu_kernels
from attnlab.nn.layout import KernelLinear

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
    """1–8 rows in any leading shape, a non-contiguous x and no rows at all: the kernel's own
    numbers (bit for bit the op called directly), within 1e-5 of the float64 product."""
    torch.manual_seed(0)
    plain, layer = _pair(bias)
    exact_layer = torch.nn.Linear(83, 45, bias=bias).double()
    exact_layer.load_state_dict(plain.state_dict())
    cases = [torch.randn(1, 83), torch.randn(2, 3, 83), torch.randn(8, 83),
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


@pytest.mark.parametrize("bias", [True, False])
def test_everything_else_is_nn_linears_own_product(bias):
    """More rows than the kernel takes, a gradient to pass (of x, or of the bias alone),
    bf16, and CPU autocast: nn.Linear's bits and autograd."""
    torch.manual_seed(0)
    plain, layer = _pair(bias)
    x = torch.randn(9, 83)
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
    with torch.no_grad():
        half, plain_half = layer.to(torch.bfloat16), plain.to(torch.bfloat16)
        assert torch.equal(half(x.bfloat16()), plain_half(x.bfloat16()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_float_kernel_widens_16_bit_weights(dtype):
    """float16 and bfloat16 weights, widened to float32 as they are read, against the float64
    product of the same (rounded) weights."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 83), torch.randn(45, 83).to(dtype), torch.randn(45)
    got = torch.ops.attnlab.float_matmul(x, w, b)
    exact = (x.double() @ w.double().t() + b.double()).float()
    assert torch.allclose(got, exact, atol=1e-5, rtol=1e-5)
