"""Decoder-only language models: GPT-2 and Llama-style, from the same blocks.

    h₀     = Dropout(E[ids] + P[pos])          (learned positions; RoPE adds nothing here)
    hₗ     = Block(hₗ₋₁, causal)                 l = 1..N  (pre-LN: x + F(Norm(x)))
    logits = Norm(h_N) · Eᵀ                      (batch, seq, vocab), tied to the embedding

A GPT block is the encoder layer of the paper run with a causal mask, so this file only
composes :mod:`attnlab.nn`. The family is chosen by the config: GPT-2 uses learned positions,
LayerNorm, GELU (tanh) and biases; Llama uses RoPE, RMSNorm, SwiGLU, grouped-query attention
and no biases; Mistral is Llama with a sliding window (``config.sliding_window`` = W: position
i attends positions i − W < j ≤ i, decoded with a rolling cache of W entries per layer).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.nn import (
    DecoderOnly,
    SelfAttentionCache,
    TokenEmbedding,
    build_positional,
    sliding_window_mask,
)


class GPT(nn.Module):
    """Causal language model: ``ids (batch, seq)`` -> ``logits (batch, seq, vocab)``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "decoder":
            raise BadInput(f"GPT needs arch='decoder', got {config.arch!r}")
        self.config = config
        self.embed = TokenEmbedding(config.vocab_size, config.d_model, config.scale_embeddings,
                                    init_std=0.02)
        self.positional = build_positional(config.positional, config.d_model, config.n_heads,
                                           config.max_len, config.rope_base,
                                           config.rope_scaling, config.d_k)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = DecoderOnly(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        """GPT-2's scheme: N(0, 0.02) for matrices, zero biases; residual output projections
        scaled by 1/√(2N) so the residual stream's variance does not grow with depth."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02
                if name.endswith(("out_proj.weight", "ffn.w2.weight")):
                    std /= (2 * self.config.n_decoder_layers) ** 0.5
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: Tensor, positions: Tensor | None = None,
                cache: SelfAttentionCache | None = None, attention_mask: Tensor | None = None,
                need_weights: bool = False) -> Tensor:
        """Next-token logits ``(batch, seq, vocab)`` for every position: ``lm_head`` of
        :meth:`features` (same arguments)."""
        return self.lm_head(self.features(ids, positions, cache, attention_mask, need_weights))

    def features(self, ids: Tensor, positions: Tensor | None = None,
                 cache: SelfAttentionCache | None = None, attention_mask: Tensor | None = None,
                 need_weights: bool = False) -> Tensor:
        """The last block's output ``(batch, seq, d_model)``, before the vocabulary projection
        (a scorer that needs the logits of a few positions projects only those).

        Args:
            ids: ``(batch, seq)`` token ids; with a ``cache``, only the new tokens.
            positions: ``(seq,)`` or ``(batch, seq)``; default continues after the cache.
            cache: from :meth:`new_cache`; keys/values of earlier tokens are reused.
            attention_mask: ``(batch, total_len)`` True/1 at real tokens (left padding), where
                total_len counts cached tokens too.
        """
        offset = 0 if cache is None else cache.length
        self.config.check_length(offset + ids.shape[1])
        if positions is None:
            positions = _positions(ids, offset, attention_mask)
        x = self.embed_tokens(ids, positions)
        mask = self.block_mask(ids.shape[1], ids.device, offset, cache, attention_mask)
        return self.blocks(x, mask=mask, positional=self.positional, positions=positions,
                           cache=cache, need_weights=need_weights)

    def embed_tokens(self, ids: Tensor, positions: Tensor) -> Tensor:
        """``h₀ = Dropout(E[ids] + P[pos])``: ``ids (batch, seq)`` -> ``(batch, seq, d_model)``
        (RoPE and ALiBi add nothing here: they act inside attention)."""
        return self.embed_dropout(self.positional.embed(self.embed(ids), positions))

    def block_mask(self, new: int, device: torch.device, offset: int = 0,
                   cache: SelfAttentionCache | None = None,
                   attention_mask: Tensor | None = None) -> Tensor | None:
        """What the blocks may attend besides causality, for ``new`` queries after ``offset``
        cached tokens: the padding of ``attention_mask (batch, total_len)`` as ``(batch, 1, 1,
        total_len)`` and, with a sliding window, its band (:meth:`_window_mask`); None when
        neither applies."""
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]
        if self.config.sliding_window is not None:
            mask = self._window_mask(new, offset, cache, mask, device)
        return mask

    def _window_mask(self, new: int, offset: int, cache: SelfAttentionCache | None,
                     padding: Tensor | None, device: torch.device) -> Tensor:
        """The band ``i − W < j ≤ i`` and the padding of the keys the layers will see (a
        rolling cache's slots, in any order). i and j count real tokens: left padding shifts
        both alike, so this is transformers' band over sequence indices, and padding between
        real tokens (batched scoring) does not narrow a row's window."""
        keys = None if cache is None else cache.key_index(new, device)
        rolling = keys is not None
        if not rolling:
            keys = torch.arange(offset + new, device=device)
        if padding is None:
            queries = torch.arange(offset, offset + new, device=device)
            return sliding_window_mask(queries, keys, self.config.sliding_window)
        real = padding[:, 0, 0]  # (batch, total)
        if rolling and new > 1 and not bool((real[:, 1:] >= real[:, :-1]).all()):
            # a rolling cache keeps the last W slots, which hold a row's last W real tokens
            # only when its padding all comes first
            raise BadInput("a rolling (sliding-window) KV cache needs left padding only; use "
                           "new_cache(rolling=False) for padding between tokens")
        counted = real.long().cumsum(-1)  # real tokens so far
        band = sliding_window_mask(counted[:, offset:], counted[:, keys],
                                   self.config.sliding_window)
        return band & padding[..., keys]

    cache_dtype: torch.dtype | None = None  # the KV cache's storage (None: the keys' dtype)

    def new_cache(self, capacity: int = 256, rolling: bool = True) -> SelfAttentionCache:
        """One KV cache per layer, stored in ``cache_dtype`` (``for_decoding``'s
        ``kv_cache``); with a sliding window, rolling ones of W entries (unless ``rolling`` is
        False: rows padded between real tokens reach back further than W slots)."""
        window = self.config.sliding_window if rolling else None
        return SelfAttentionCache(len(self.blocks.layers), capacity, window, self.cache_dtype)

    def components(self) -> OrderedDict[str, list[nn.Module]]:
        embeddings: list[nn.Module] = [self.embed, self.positional]
        if self.lm_head.weight is not self.embed.weight:
            embeddings.append(self.lm_head)
        return OrderedDict([("embeddings", embeddings),
                            ("block (one)", [self.blocks.layers[0]]),
                            ("blocks", [self.blocks])])


def _positions(ids: Tensor, offset: int, attention_mask: Tensor | None) -> Tensor:
    """Absolute positions; with left padding, each row counts from its first real token."""
    if attention_mask is None:
        return torch.arange(offset, offset + ids.shape[1], device=ids.device)
    counted = attention_mask.long().cumsum(-1) - 1  # (batch, total_len)
    return counted.clamp(min=0)[:, offset:]
