"""Encoder/decoder layers and stacks against torch.nn's with copied weights, plus properties."""

import pytest
import torch
from torch import nn

from attnlab import ModelConfig
from attnlab.nn import (
    Decoder,
    DecoderLayer,
    DecoderOnly,
    Encoder,
    EncoderLayer,
    SelfAttentionCache,
    build_positional,
    causal_mask,
)
from tests.nn.test_multihead import copy_from_torch

D, H, FF = 16, 4, 32


def config(**kw):
    base = dict(d_model=D, n_heads=H, d_ff=FF, dropout=0.0, n_encoder_layers=2,
                n_decoder_layers=2, vocab_size=50)
    return ModelConfig(**{**base, **kw})


def copy_linear(ours: nn.Linear, ref: nn.Linear) -> None:
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)


def copy_norm(ours, ref) -> None:
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)


def copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    copy_from_torch(ours.self_attn, ref.self_attn)
    copy_linear(ours.ffn.w1, ref.linear1)
    copy_linear(ours.ffn.w2, ref.linear2)
    copy_norm(ours.attn_sublayer.norm, ref.norm1)
    copy_norm(ours.ffn_sublayer.norm, ref.norm2)


def copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
    copy_from_torch(ours.self_attn, ref.self_attn)
    copy_from_torch(ours.cross_attn, ref.multihead_attn)
    copy_linear(ours.ffn.w1, ref.linear1)
    copy_linear(ours.ffn.w2, ref.linear2)
    copy_norm(ours.attn_sublayer.norm, ref.norm1)
    copy_norm(ours.cross_sublayer.norm, ref.norm2)
    copy_norm(ours.ffn_sublayer.norm, ref.norm3)


def randomise(module: nn.Module) -> nn.Module:
    """Random biases and norm parameters, so that copying them is actually tested."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.5).add_(1.0 if "norm" in name and "weight" in name else 0.0)
    return module


SRC_KEEP = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
TGT_KEEP = torch.tensor([[True] * 5, [True] * 4 + [False]])


@pytest.mark.parametrize("padding", [False, True])
def test_encoder_layer_matches_torch(padding):
    ref = randomise(nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True))
    ours = EncoderLayer(config())
    copy_encoder_layer(ours, ref)
    x = torch.randn(2, 7, D)
    keep = SRC_KEEP if padding else torch.ones(2, 7, dtype=torch.bool)
    # train() keeps torch off its nested-tensor fast path, which zeroes padded rows
    expected = ref.train()(x, src_key_padding_mask=~keep)
    assert (ours(x, keep[:, None, None, :]) - expected).abs().max() <= 1e-5


def test_decoder_layer_matches_torch():
    ref = randomise(nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True))
    ours = DecoderLayer(config())
    copy_decoder_layer(ours, ref)
    y, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    expected = ref(y, memory, tgt_mask=~causal_mask(5)[0, 0], tgt_key_padding_mask=~TGT_KEEP,
                   memory_key_padding_mask=~SRC_KEEP)
    out = ours(y, memory, tgt_mask=TGT_KEEP[:, None, None, :],
               memory_mask=SRC_KEEP[:, None, None, :], is_causal=True)
    assert (out - expected).abs().max() <= 1e-5


def test_encoder_decoder_stack_matches_torch_transformer():
    ref = randomise(nn.Transformer(D, H, 2, 2, FF, dropout=0.0, batch_first=True))
    cfg = config(final_norm=True)  # nn.Transformer ends each stack with a LayerNorm
    encoder, decoder = Encoder(cfg), Decoder(cfg)
    for ours, theirs in zip(encoder.layers, ref.encoder.layers, strict=True):
        copy_encoder_layer(ours, theirs)
    for ours, theirs in zip(decoder.layers, ref.decoder.layers, strict=True):
        copy_decoder_layer(ours, theirs)
    copy_norm(encoder.norm, ref.encoder.norm)
    copy_norm(decoder.norm, ref.decoder.norm)
    src, tgt = torch.randn(2, 7, D), torch.randn(2, 5, D)
    expected = ref.train()(src, tgt, tgt_mask=~causal_mask(5)[0, 0],
                           src_key_padding_mask=~SRC_KEEP, memory_key_padding_mask=~SRC_KEEP)
    src_mask = SRC_KEEP[:, None, None, :]
    memory = encoder(src, src_mask)
    out = decoder(tgt, memory, memory_mask=src_mask, is_causal=True)
    assert (out - expected).abs().max() <= 1e-5


def test_gradcheck_through_layers_float64():
    enc = EncoderLayer(config()).double()
    dec = DecoderLayer(config()).double()
    x = torch.randn(2, 3, D, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, 4, D, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[True, True, True, True], [True, True, False, False]])[:, None, None]
    assert torch.autograd.gradcheck(lambda x: enc(x, keep[..., :3]), (x,))
    assert torch.autograd.gradcheck(lambda x, m: dec(x, m, memory_mask=keep), (x, m))


def test_causal_layer_earlier_outputs_ignore_later_tokens():
    layer = EncoderLayer(config(norm_placement="pre", activation="gelu"))
    x = torch.randn(1, 8, D)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 3, D)
    a, b = layer(x, is_causal=True), layer(x2, is_causal=True)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-3)


def test_permutation_equivariance_without_positions():
    layer = EncoderLayer(config())
    x = torch.randn(2, 6, D)
    perm = torch.randperm(6)
    assert torch.allclose(layer(x)[:, perm], layer(x[:, perm]), atol=1e-5)
    # adding sinusoidal positions (as the models do before the first layer) breaks it
    pe = build_positional("sinusoidal", D, H, 64, 1e4)
    pos = torch.arange(6)
    with_pe = layer(pe.embed(x, pos))[:, perm]
    assert not torch.allclose(with_pe, layer(pe.embed(x[:, perm], pos)), atol=1e-3)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_cached_decoding_through_a_stack_equals_full(positional):
    cfg = config(positional=positional, norm_placement="pre", norm="rmsnorm",
                 activation="swiglu", num_kv_heads=2, bias=False)
    pe = build_positional(positional, D, H, 64, 1e4)
    stack = DecoderOnly(cfg)  # GPT/Llama's stack: causal, one self-attention cache a layer
    x = torch.randn(2, 9, D)
    full = stack(pe.embed(x, torch.arange(9)), positional=pe, positions=torch.arange(9))
    cache = SelfAttentionCache(len(stack.layers), capacity=4)
    outs = []
    for start, end in ((0, 4), (4, 5), (5, 9)):
        pos = torch.arange(start, end)
        outs.append(stack(pe.embed(x[:, start:end], pos), positional=pe, positions=pos,
                          cache=cache))
    assert (torch.cat(outs, 1) - full).abs().max() <= 1e-5
