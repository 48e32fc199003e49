"""attnlab's one-query attention (attnlab/cpu/csrc/decode_attention.cpp) against a float64
reference of softmax(s · q Kᵀ) V over the allowed slots, and its place in the CPU engine's
attention (attnlab.cpu.attention: decode_attention, which an engine-ready model calls)."""

import math

import pytest
import torch

from attnlab.cpu import kernels as cpu_kernels
from attnlab.cpu.attention import decode_attention as scaled_dot_product_attention
from attnlab.cpu.attention import kernel_applies
from attnlab.nn import attention

built = pytest.mark.skipif(not cpu_kernels.available(),
                           reason="attnlab's CPU kernels could not be built here")


def _reference(q, k, v, allowed, scale):
    """float64 softmax attention, one query a row; rows with no allowed slot give zeros."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    scores = scale * q.double() @ k.transpose(-2, -1)  # (b, h, 1, slots)
    allowed = allowed.view(allowed.shape[0], 1, 1, -1).expand_as(scores)
    scores = scores.masked_fill(~allowed, -math.inf)
    weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    return weights @ v.masked_fill(~allowed.transpose(-2, -1)[..., :1], 0.0)


def _case(batch, heads, kv_heads, slots, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, 1, d, generator=g),
            torch.randn(batch, kv_heads, slots, d, generator=g),
            torch.randn(batch, kv_heads, slots, dv, generator=g))


@built
@pytest.mark.parametrize("heads, kv_heads, d, dv", [
    (4, 4, 64, 64), (6, 2, 64, 64), (4, 1, 128, 128), (3, 3, 24, 40), (2, 1, 13, 7)])
def test_matches_softmax_attention_over_the_allowed_slots(heads, kv_heads, d, dv):
    """Grouped queries, the register path (64, 128) and the general one, holes in the mask,
    one row fully masked (zeros, never NaN), a mask shared by the batch."""
    q, k, v = _case(3, heads, kv_heads, 40, d, dv)
    allowed = torch.zeros(3, 40, dtype=torch.bool)
    allowed[0, :17] = True
    allowed[1, 5:33] = True
    allowed[1, 9] = allowed[1, 20] = False  # holes
    scale = d ** -0.5
    got = torch.ops.attnlab.decode_attention(q, k, v, allowed, scale)
    want = _reference(q, k, v, allowed, scale)
    assert got.shape == (3, heads, 1, dv) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    shared = torch.ops.attnlab.decode_attention(q, k, v, allowed[1:2], scale)
    torch.testing.assert_close(shared.double(), _reference(q, k, v, allowed[1:2].expand(3, -1),
                                                           scale), rtol=1e-5, atol=1e-6)
    everything = torch.ops.attnlab.decode_attention(q, k, v, None, scale)
    torch.testing.assert_close(everything.double(),
                               _reference(q, k, v, torch.ones(3, 40, dtype=torch.bool), scale),
                               rtol=1e-5, atol=1e-6)


@built
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kv_heads, d, dv", [
    (9, 3, 64, 64), (4, 2, 128, 128), (2, 1, 13, 13), (3, 3, 24, 40)])
def test_a_16_bit_cache_is_read_in_its_own_dtype(dtype, heads, kv_heads, d, dv):
    """bf16 and fp16 q, k, v (an int4 model's float dtype where bf16 is native): the sums in
    float32, so the output is the float64 reference of the same (rounded) values, rounded once
    to the dtype: within its unit roundoff, 2⁻⁸ (bf16) or 2⁻¹¹ (fp16) of each value, plus float32's
    sums. Also the shared mask, the fully masked row (zeros) and a cache view with its own
    strides."""
    q, k, v = (t.to(dtype) for t in _case(2, heads, kv_heads, 70, d, dv, seed=7))
    allowed = torch.zeros(2, 70, dtype=torch.bool)
    allowed[0, 3:61] = True
    allowed[0, 30] = False
    scale = d ** -0.5
    got = torch.ops.attnlab.decode_attention(q, k, v, allowed, scale)
    assert got.dtype == dtype and got.shape == (2, heads, 1, dv)
    want = _reference(q, k, v, allowed, scale)
    step = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
    assert ((got.double() - want).abs() <= step * want.abs() + 1e-6).all()
    view = torch.ops.attnlab.decode_attention(q, k[:, :, :61], v[:, :, :61],
                                              allowed[:, :61].contiguous(),
                                              scale)  # (a growing cache's slice)
    assert torch.equal(view, got)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    mask = allowed[:1, None, None, :]
    routed = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)  # the kernel's path
    assert torch.equal(routed, torch.ops.attnlab.decode_attention(q, k, v, allowed[:1], scale))
    fused = attention._fused(q, k, v, mask, None, 0.0, False, scale)  # PyTorch's, in bf16/fp16
    torch.testing.assert_close(routed.float(), fused.float(), rtol=step * 4, atol=step * 4)


@built
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_queries_read_a_16_bit_cache(dtype):
    """float32 q over bf16 or fp16 k and v (``--kv-cache bf16`` under float32 activations):
    a float32 output within float32's sums of the float64 reference of the same (rounded)
    keys and values, no rounding of its own; routed there by scaled_dot_product_attention,
    whose other paths (several queries) widen the cache to q's dtype."""
    q, k, v = _case(2, 6, 2, 50, 64, 64, seed=3)
    k, v = k.to(dtype), v.to(dtype)
    allowed = torch.zeros(2, 50, dtype=torch.bool)
    allowed[0, :44] = allowed[1, 7:50] = True
    got = torch.ops.attnlab.decode_attention(q, k, v, allowed, 0.125)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _reference(q, k, v, allowed, 0.125),
                               rtol=1e-5, atol=1e-6)
    mask = allowed[:, None, None, :]
    assert torch.equal(scaled_dot_product_attention(q, k, v, mask=mask, scale=0.125), got)
    two = torch.cat([q, q.flip(1)], 2)  # (2, 6, 2, 64): not the kernel's
    got = scaled_dot_product_attention(two, k, v, mask=mask, scale=0.125)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _reference(two, k, v, allowed, 0.125),
                               rtol=1e-5, atol=1e-5)


@built
def test_slots_the_mask_forbids_are_never_read():
    """NaN keys and values in the holes and past the last allowed slot (a static cache's empty
    tail) leave the output finite and exact; PyTorch's fused kernel gives NaN there."""
    q, k, v = _case(2, 4, 2, 64, 16, 16, seed=1)
    allowed = torch.zeros(2, 64, dtype=torch.bool)
    allowed[:, :20] = True
    allowed[1, 7] = False
    want = _reference(q, k, v, allowed, 0.25)
    k[:, :, 20:] = v[:, :, 20:] = math.nan
    k[1, :, 7] = v[1, :, 7] = math.nan
    got = scaled_dot_product_attention(q, k, v, mask=allowed[:, None, None, :], scale=0.25)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    fused = attention._fused(q, k, v, allowed[:, None, None, :], None, 0.0, False, 0.25)
    assert fused.isnan().any()


@built
def test_a_cache_view_with_its_own_strides_is_read_in_place():
    """The growing cache hands attention a slice of its storage (slots < capacity)."""
    q, k, v = _case(2, 4, 2, 48, 32, 32, seed=2)
    k_view, v_view = k[:, :, :30], v[:, :, :30]
    assert not k_view.is_contiguous()
    got = scaled_dot_product_attention(q, k_view, v_view)
    want = _reference(q, k_view, v_view, torch.ones(2, 30, dtype=torch.bool), 32 ** -0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_without_the_kernels_pytorchs_fused_kernel_gives_the_same(monkeypatch):
    q, k, v = _case(2, 6, 3, 25, 16, 16, seed=3)
    allowed = torch.rand(2, 1, 1, 25, generator=torch.Generator().manual_seed(0)) < 0.7
    ours = scaled_dot_product_attention(q, k, v, mask=allowed)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    theirs = scaled_dot_product_attention(q, k, v, mask=allowed)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@built
def test_a_gradient_takes_the_differentiable_path():
    q, k, v = _case(1, 2, 2, 10, 8, 8, seed=4)
    q.requires_grad_(True)
    out = scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert "decode_attention" not in str(out.grad_fn)


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_equals_eager_bit_for_bit(dtype):
    q, k, v = (t.to(dtype) for t in _case(1, 9, 3, 64, 64, 64, seed=5))
    allowed = torch.zeros(1, 1, 1, 64, dtype=torch.bool)
    allowed[..., :23] = True

    def step(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, mask=mask)

    compiled = torch.compile(step, backend="inductor", fullgraph=True, dynamic=False)
    assert torch.equal(compiled(q, k, v, allowed), step(q, k, v, allowed))


@built
def test_bad_operands_are_refused_with_the_kernels_name():
    q, k, v = _case(1, 2, 2, 8, 8, 8)
    with pytest.raises(RuntimeError, match="attnlab decode attention: one query a row"):
        torch.ops.attnlab.decode_attention(q.expand(1, 2, 2, 8), k, v, None, 1.0)
    with pytest.raises(RuntimeError, match="mask must be"):
        torch.ops.attnlab.decode_attention(q, k, v, torch.ones(1, 9, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="of one dtype"):
        torch.ops.attnlab.decode_attention(q, k.half(), v.bfloat16(), None, 1.0)
    with pytest.raises(RuntimeError, match="q must be k's dtype or float32"):
        torch.ops.attnlab.decode_attention(q.half(), k, v, None, 1.0)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        torch.ops.attnlab.decode_attention(q.double(), k.double(), v.double(), None, 1.0)
    with pytest.raises(RuntimeError, match="kv_heads must divide heads"):
        torch.ops.attnlab.decode_attention(q, k[:, :0], v[:, :0], None, 1.0)


@built
def test_only_a_mask_of_one_row_of_slots_per_batch_row_takes_the_kernel():
    q, k, v = _case(2, 4, 2, 12, 8, 8, seed=6)
    applies = kernel_applies
    assert applies(q, k, v, torch.ones(2, 1, 1, 12, dtype=torch.bool), None, 0.0, False)
    assert applies(q, k, v, torch.ones(1, 12, dtype=torch.bool), None, 0.0, False)  # (q, k)
    per_head = torch.rand(2, 4, 1, 12, generator=torch.Generator().manual_seed(1)) < 0.5
    assert not applies(q, k, v, per_head, None, 0.0, False)
    assert not applies(q, k, v, None, torch.zeros(1, 4, 1, 12), 0.0, False)  # a bias (ALiBi)
    assert not applies(q.double(), k.double(), v.double(), None, None, 0.0, False)
    assert not applies(q.bfloat16(), k, v, None, None, 0.0, False)  # mixed dtypes
    assert applies(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, None, 0.0, False)
    assert not applies(q[0], k[0], v[0], None, None, 0.0, False)  # not (batch, heads, len, d)
    got = scaled_dot_product_attention(q, k, v, mask=per_head)
    want = attention._fused(q, k, v, per_head, None, 0.0, False, 8 ** -0.5)
    torch.testing.assert_close(got, want)
