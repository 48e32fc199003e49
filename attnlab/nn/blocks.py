"""Transformer layers and stacks, composed from attention, feed-forward and norms.

Encoder layer (paper Fig. 1, left), two residual sublayers:

    x ← Sublayer(x, SelfAttention)        (bidirectional; causal for GPT-style decoders)
    x ← Sublayer(x, FeedForward)

Decoder layer (Fig. 1, right), three:

    y ← Sublayer(y, MaskedSelfAttention)  (position i sees positions ≤ i)
    y ← Sublayer(y, CrossAttention(·, memory))  (queries from y, keys/values from the encoder)
    y ← Sublayer(y, FeedForward)

where Sublayer is post-LN ``Norm(x + Dropout(F(x)))`` or pre-LN ``x + Dropout(F(Norm(x)))``
(:class:`attnlab.nn.norms.Residual`). Shapes stay ``(batch, seq, d_model)`` throughout.

Stacks: :class:`Encoder` (bidirectional; BERT and the encoder–decoder), :class:`Decoder`
(with cross-attention; the encoder–decoder) and :class:`DecoderOnly` (GPT, Llama). A GPT
block is the paper's encoder layer run with a causal mask, so :class:`DecoderOnly` stacks
:class:`EncoderLayer` and keeps one self-attention :class:`KVCache` per layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from attnlab.nn.cache import (
    DecoderCache,
    KVCache,
    LayerCache,
    SelfAttentionCache,
    StaticDecoderCache,
)
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.norms import Residual, build_norm
from attnlab.nn.packing import Packing
from attnlab.nn.positional import PositionalEncoding

if TYPE_CHECKING:
    from attnlab.config import ModelConfig


def _attention(config: ModelConfig) -> MultiHeadAttention:
    # scale None: the paper's 1/√d_k; T5 (scale_attention=False) adds its bias to Q·Kᵀ as is
    return MultiHeadAttention(
        config.d_model, config.n_heads, config.num_kv_heads, bias=config.bias,
        fused_qkv=config.fused_qkv, dropout=config.attention_dropout, head_dim=config.head_dim,
        scale=None if config.scale_attention else 1.0, qkv_bias=config.biased_qkv,
    )


def _position_bias(positional: PositionalEncoding | None, positions: Tensor | None, new: int,
                   cached: int, k_pos: Tensor | None = None) -> Tensor | None:
    """The score bias of the positions (ALiBi, T5's relative bias; None for the others),
    computed once per forward pass: every layer of a stack adds the same one. The keys are the
    ``cached + new`` positions that end at the last query, or ``k_pos`` when given."""
    if positional is None or positions is None:
        return None
    return positional.attention_bias(positions, cached + new, k_pos)


def _residual(config: ModelConfig) -> Residual:
    norm = build_norm(config.norm, config.d_model, config.norm_eps, bias=config.bias)
    return Residual(norm, config.dropout, config.pre_norm)


def _final_norm(config: ModelConfig) -> nn.Module:
    """Pre-LN stacks end with a norm (the residual path is never normalised otherwise)."""
    if not config.use_final_norm:
        return nn.Identity()
    return build_norm(config.norm, config.d_model, config.norm_eps, bias=config.bias)


def _feedforward(config: ModelConfig) -> FeedForward:
    return FeedForward(
        config.d_model, config.d_ff, config.activation, config.bias, config.activation_dropout
    )


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual sublayer.

    With ``need_weights`` the per-head attention weights ``(batch, heads, q_len, k_len)`` are
    kept in ``self.attn_weights`` for inspection.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = _attention(config)
        self.attn_sublayer = _residual(config)
        self.ffn = _feedforward(config)
        self.ffn_sublayer = _residual(config)
        self.attn_weights: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positional: PositionalEncoding | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
        packing: Packing | None = None,
    ) -> Tensor:
        """``x (batch, seq, d_model)`` -> ``(batch, seq, d_model)``; ``bias``: the stack's
        position score bias ``(1 or batch, heads, seq, k_len)``, added to every layer's scores.
        ``packing``: ``x`` holds only the real tokens, ``(n_real, d_model)``, and so does the
        output (:mod:`attnlab.nn.packing`)."""

        def attend(h: Tensor) -> Tensor:
            out = self.self_attn(h, mask=mask, is_causal=is_causal, positional=positional,
                                 positions=positions, cache=cache, need_weights=need_weights,
                                 bias=bias, packing=packing)
            if need_weights:
                out, self.attn_weights = out
            return out

        x = self.attn_sublayer(x, attend)
        return self.ffn_sublayer(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, feed-forward.

    With ``need_weights`` the weights are kept in ``self.attn_weights`` (self-attention) and
    ``self.cross_weights`` (cross-attention, ``(batch, heads, tgt_len, src_len)``).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = _attention(config)
        self.attn_sublayer = _residual(config)
        self.cross_attn = _attention(config)
        self.cross_sublayer = _residual(config)
        self.ffn = _feedforward(config)
        self.ffn_sublayer = _residual(config)
        self.attn_weights: Tensor | None = None
        self.cross_weights: Tensor | None = None

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        is_causal: bool = True,
        positional: PositionalEncoding | None = None,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
    ) -> Tensor:
        """``y (batch, tgt_len, d)``, ``memory (batch, src_len, d)`` -> ``(batch, tgt_len, d)``.

        ``tgt_mask`` / ``memory_mask`` are boolean (True = may attend); the causal constraint
        is added by ``is_causal`` (default on). ``bias``: the position score bias of the
        self-attention (cross-attention has none: source and target positions are unrelated).
        """

        def attend(h: Tensor) -> Tensor:
            out = self.self_attn(h, mask=tgt_mask, is_causal=is_causal, positional=positional,
                                 positions=positions, need_weights=need_weights, bias=bias,
                                 cache=None if cache is None else cache.self_attn)
            if need_weights:
                out, self.attn_weights = out
            return out

        def cross(h: Tensor) -> Tensor:
            out = self.cross_attn(h, context=memory, mask=memory_mask, need_weights=need_weights,
                                  cache=None if cache is None else cache.cross_attn)
            if need_weights:
                out, self.cross_weights = out
            return out

        y = self.attn_sublayer(y, attend)
        y = self.cross_sublayer(y, cross)
        return self.ffn_sublayer(y, self.ffn)


class _SelfAttentionStack(nn.Module):
    """N :class:`EncoderLayer` blocks, then a final norm when the config asks for one (pre-LN);
    ``causal`` says whether position i may see later positions."""

    causal = False

    def __init__(self, config: ModelConfig, n_layers: int):
        super().__init__()
        if config.share_layers:  # ALBERT: the same layer object (so the same weights) N times
            shared = EncoderLayer(config)
            self.layers = nn.ModuleList([shared] * n_layers)
        else:
            self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(n_layers))
        self.norm = _final_norm(config)

    def _run(self, x: Tensor, mask: Tensor | None, positional: PositionalEncoding | None,
             positions: Tensor | None, cache: SelfAttentionCache | None,
             need_weights: bool, packing: Packing | None = None) -> Tensor:
        bias = _position_bias(positional, positions, x.shape[1],
                              0 if cache is None else cache.length)
        if packing is not None:
            x = packing.pack(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, self.causal, positional, positions,
                      None if cache is None else cache[i], need_weights, bias, packing)
        x = self.norm(x)
        return x if packing is None else packing.unpack(x)


class Encoder(_SelfAttentionStack):
    """The encoder (BERT, and the encoder–decoder's): every position sees every unmasked
    position."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.n_encoder_layers)

    def forward(self, x: Tensor, mask: Tensor | None = None,
                positional: PositionalEncoding | None = None, positions: Tensor | None = None,
                need_weights: bool = False, packing: Packing | None = None) -> Tensor:
        """``x (batch, seq, d_model)`` -> ``(batch, seq, d_model)``; with ``packing`` the
        position-wise work runs on the real tokens only (zeros come out at padding)."""
        return self._run(x, mask, positional, positions, None, need_weights, packing)


class DecoderOnly(_SelfAttentionStack):
    """The stack of a decoder-only model (GPT, Llama): self-attention that sees only earlier
    positions and no cross-attention, one self-attention :class:`KVCache` a layer."""

    causal = True

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.n_decoder_layers)

    def forward(self, x: Tensor, mask: Tensor | None = None,
                positional: PositionalEncoding | None = None, positions: Tensor | None = None,
                cache: SelfAttentionCache | None = None, need_weights: bool = False) -> Tensor:
        """``x (batch, seq, d_model)`` -> ``(batch, seq, d_model)``; with a ``cache``, ``x``
        holds only the new positions and earlier keys/values come from the cache."""
        return self._run(x, mask, positional, positions, cache, need_weights)


class Decoder(nn.Module):
    """N decoder layers, then a final norm when the config asks for one (pre-LN)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = _final_norm(config)

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        is_causal: bool = True,
        positional: PositionalEncoding | None = None,
        positions: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """``y (batch, tgt_len, d)``, ``memory (batch, src_len, d)`` -> ``(batch, tgt_len, d)``."""
        # a compiled step's static cache holds position j in slot j, whatever the query's
        k_pos = cache.key_positions if isinstance(cache, StaticDecoderCache) else None
        bias = _position_bias(positional, positions, y.shape[1],
                              0 if cache is None else cache.length, k_pos)
        for i, layer in enumerate(self.layers):
            y = layer(y, memory, tgt_mask, memory_mask, is_causal, positional, positions,
                      None if cache is None else cache[i], need_weights, bias)
        return self.norm(y)
