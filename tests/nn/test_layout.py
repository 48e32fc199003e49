"""attnlab.nn.layout: the few-row float kernel's layer (the rest of decoding_layout_ is tested
with generation, tests/generation/test_generate.py; stack_rows with the integer layers,
tests/nn/test_quantized.py)."""

import pytest
import torch

from attnlab.nn import cpu_kernels
from attnlab.nn.layout import KernelLinear

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason="attnlab's CPU kernels are not built here")


def test_the_kernel_linear_equals_nn_linear_and_steps_aside():
    """KernelLinear's few-row product against nn.Linear's (float64 reference), with and without
    a bias, over 1–8 rows in any leading shape; more rows, a gradient or bf16 take
    nn.Linear's own path (its exact numbers)."""
    torch.manual_seed(0)
    for bias in (True, False):
        plain = torch.nn.Linear(83, 45, bias=bias)  # widths that are not multiples of 8
        layer = torch.nn.Linear(83, 45, bias=bias)
        layer.load_state_dict(plain.state_dict())
        layer.__class__ = KernelLinear
        for shape in [(1, 83), (2, 3, 83), (8, 83), (1, 1, 1, 83)]:
            x = torch.randn(shape)
            with torch.no_grad():
                got = layer(x)
                exact = plain.double()(x.double()).float()
                plain.float()
            assert got.shape == exact.shape
            assert torch.allclose(got, exact, atol=1e-5, rtol=1e-5)
        x = torch.randn(9, 83)  # more rows than the kernel takes: nn.Linear's bits
        with torch.no_grad():
            assert torch.equal(layer(x), plain(x))
        x = torch.randn(2, 83, requires_grad=True)  # a gradient: nn.Linear's autograd
        layer(x).sum().backward()
        assert torch.allclose(x.grad, plain.weight.sum(0).expand(2, -1), atol=1e-6)
        with torch.no_grad():
            half = layer.to(torch.bfloat16)
            assert torch.equal(half(x.bfloat16()), torch.nn.functional.linear(
                x.bfloat16(), half.weight, half.bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_float_kernel_widens_16_bit_weights(dtype):
    """float16 and bfloat16 weights, widened to float32 as they are read, against the float64
    product of the same (rounded) weights."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 83), torch.randn(45, 83).to(dtype), torch.randn(45)
    got = torch.ops.attnlab.float_matmul(x, w, b)
    exact = (x.double() @ w.double().t() + b.double()).float()
    assert torch.allclose(got, exact, atol=1e-5, rtol=1e-5)
