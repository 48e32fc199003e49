"""MultiHeadAttention against torch.nn.MultiheadAttention with copied weights, GQA, fused QKV
and the KV cache."""

import pytest
import torch
from torch import nn

from attnlab.nn import MultiHeadAttention, causal_mask
from attnlab.nn.cache import KVCache

D, H = 16, 4


def copy_from_torch(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    wq, wk, wv = ref.in_proj_weight.detach().chunk(3)
    bq, bk, bv = ref.in_proj_bias.detach().chunk(3)
    with torch.no_grad():
        if ours.fused_qkv:
            ours.qkv.weight.copy_(ref.in_proj_weight)
            ours.qkv.bias.copy_(ref.in_proj_bias)
        else:
            for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
                proj.weight.copy_(w)
                proj.bias.copy_(b)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


@pytest.fixture
def pair():
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    nn.init.normal_(ref.in_proj_bias)  # torch zero-inits biases; make them count
    return ref


@pytest.mark.parametrize("fused_qkv", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("case", ["self", "self-causal", "self-padding", "cross-padding"])
def test_matches_torch_multihead_attention(pair, fused_qkv, need_weights, case):
    ref = pair
    ours = MultiHeadAttention(D, H, fused_qkv=fused_qkv)
    copy_from_torch(ours, ref)
    x = torch.randn(2, 5, D)
    memory = torch.randn(2, 7, D)
    context = memory if case.startswith("cross") else None
    kv = x if context is None else memory
    k_len = kv.shape[1]
    keep = torch.ones(2, k_len, dtype=torch.bool)
    if case.endswith("padding"):
        keep[1, -2:] = False
    causal = case == "self-causal"
    expected, expected_w = ref(x, kv, kv, key_padding_mask=~keep,
                               attn_mask=~causal_mask(5)[0, 0] if causal else None,
                               need_weights=True, average_attn_weights=False)
    result = ours(x, context=context, mask=keep[:, None, None, :], is_causal=causal,
                  need_weights=need_weights)
    out = result[0] if need_weights else result
    assert (out - expected).abs().max() <= 1e-5
    if need_weights:
        assert (result[1] - expected_w).abs().max() <= 1e-5


def test_grouped_query_attention_equals_mha_with_repeated_kv_heads():
    gqa = MultiHeadAttention(D, H, num_kv_heads=2, bias=False)
    mha = MultiHeadAttention(D, H, bias=False)
    d_k = D // H
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.out_proj.weight.copy_(gqa.out_proj.weight)
        for big, small in ((mha.k_proj, gqa.k_proj), (mha.v_proj, gqa.v_proj)):
            heads = small.weight.view(2, d_k, D).repeat_interleave(2, dim=0)
            big.weight.copy_(heads.reshape(D, D))
    x = torch.randn(3, 6, D)
    assert gqa.k_proj.weight.shape == (2 * d_k, D)
    for need_weights in (False, True):
        a = gqa(x, is_causal=True, need_weights=need_weights)
        b = mha(x, is_causal=True, need_weights=need_weights)
        a, b = (a[0], b[0]) if need_weights else (a, b)
        assert (a - b).abs().max() <= 1e-5


def test_incremental_self_attention_with_cache_equals_full():
    attn = MultiHeadAttention(D, H, num_kv_heads=2)
    x = torch.randn(2, 9, D)
    full = attn(x, is_causal=True)
    cache = KVCache(capacity=4)  # small on purpose: it must grow
    steps = [attn(x[:, :3], is_causal=True, cache=cache)]
    for t in range(3, 9):
        steps.append(attn(x[:, t : t + 1], is_causal=True, cache=cache))
    assert cache.length == 9
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5


def test_cross_attention_cache_computes_keys_and_values_once():
    attn = MultiHeadAttention(D, H)
    memory = torch.randn(2, 7, D)
    calls = []
    attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    cache = KVCache(static=True)
    y = torch.randn(2, 4, D)
    outs = [attn(y[:, t : t + 1], context=memory, cache=cache) for t in range(4)]
    assert len(calls) == 1
    assert (torch.cat(outs, 1) - attn(y, context=memory)).abs().max() <= 1e-5


def test_cache_reorder_selects_rows():
    cache = KVCache()
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 1).contiguous()
    cache.append(k, k)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


def test_used_alone_self_attention_adds_its_positions_score_bias():
    """A stack hands every layer the bias it computed once; a lone module asks for it."""
    from attnlab.nn import ALiBiPositionalEncoding

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    alibi, x, pos = ALiBiPositionalEncoding(4), torch.randn(2, 6, 32), torch.arange(6)
    given = mha(x, positional=alibi, positions=pos, bias=alibi.attention_bias(pos, 6))
    assert torch.allclose(mha(x, positional=alibi, positions=pos), given, atol=1e-6)
    assert not torch.allclose(mha(x), given, atol=1e-3)  # the bias mattered
