"""attnlab.nn: the building blocks of every Transformer family, one concept per file."""

from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.blocks import Decoder, DecoderLayer, DecoderOnly, Encoder, EncoderLayer
from attnlab.nn.cache import (
    DecoderCache,
    KVCache,
    LayerCache,
    RollingKVCache,
    SelfAttentionCache,
    StaticCache,
    StaticDecoderCache,
)
from attnlab.nn.embeddings import TokenEmbedding
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.masks import (
    causal_mask,
    combine_masks,
    lengths_mask,
    padding_mask,
    sliding_window_mask,
)
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.norms import LayerNorm, Residual, RMSNorm, build_norm
from attnlab.nn.patches import PatchEmbedding
from attnlab.nn.positional import (
    ALiBiPositionalEncoding,
    LearnedPositionalEncoding,
    NoPositionalEncoding,
    PositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    build_positional,
    positions_from,
    sinusoidal_table,
)
from attnlab.nn.relative import RelativePositionBias, relative_position_bucket

__all__ = [
    "scaled_dot_product_attention", "causal_mask", "combine_masks", "lengths_mask",
    "padding_mask", "MultiHeadAttention", "KVCache", "LayerCache", "DecoderCache",
    "SelfAttentionCache", "RollingKVCache", "StaticCache", "StaticDecoderCache",
    "sliding_window_mask",
    "PositionalEncoding", "SinusoidalPositionalEncoding", "LearnedPositionalEncoding",
    "RotaryPositionalEncoding", "ALiBiPositionalEncoding", "NoPositionalEncoding",
    "alibi_slopes", "build_positional", "positions_from", "sinusoidal_table",
    "RelativePositionBias", "relative_position_bucket",
    "LayerNorm", "RMSNorm", "Residual", "build_norm", "FeedForward", "TokenEmbedding",
    "PatchEmbedding",
    "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "DecoderOnly",
]
