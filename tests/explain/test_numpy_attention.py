"""The numpy head's hand-written backward pass against torch autograd, in float64."""

import numpy as np
import pytest
import torch

from attnlab.explain.numpy_attention import head_backward, head_forward
from attnlab.nn import scaled_dot_product_attention


@pytest.mark.parametrize("masked", [False, True])
def test_forward_and_backward_match_autograd(masked):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    d_out = torch.randn(5, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 5, generator=g) > 0.3 if masked else torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False if masked else mask[2]  # one fully masked query row, when masking
    fwd = head_forward(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    grads = head_backward(q.numpy(), k.numpy(), v.numpy(), fwd, d_out.numpy())

    qt, kt, vt = (t.clone().requires_grad_() for t in (q, k, v))
    out, weights = scaled_dot_product_attention(qt, kt, vt, mask=mask, need_weights=True)
    out.backward(d_out)
    assert np.abs(fwd.weights - weights.detach().numpy()).max() <= 1e-12
    assert np.abs(fwd.output - out.detach().numpy()).max() <= 1e-12
    for name, t in (("dQ", qt), ("dK", kt), ("dV", vt)):
        assert np.abs(grads[name] - t.grad.numpy()).max() <= 1e-6, name
    if masked:
        assert not fwd.weights[2].any() and not grads["dQ"][2].any()


def test_softmax_jacobian_row_by_finite_differences():
    """dS from the closed form equals a central difference of L = Σ dO ⊙ O."""
    rng = np.random.default_rng(1)
    q, k, v, d_out = (rng.standard_normal((3, 2)) for _ in range(4))
    grads = head_backward(q, k, v, head_forward(q, k, v), d_out)
    eps = 1e-6
    numeric = np.zeros_like(q)
    for i in np.ndindex(q.shape):
        up, down = q.copy(), q.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = ((head_forward(up, k, v).output * d_out).sum()
                      - (head_forward(down, k, v).output * d_out).sum()) / (2 * eps)
    assert np.abs(numeric - grads["dQ"]).max() <= 1e-8
