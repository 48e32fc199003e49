"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    memory = Encoder(Dropout(Emb(src)·√d + PE))                    (batch, src_len, d_model)
    hidden = Decoder(Dropout(Emb(tgt)·√d + PE), memory)            (batch, tgt_len, d_model)
    logits = hidden · Eᵀ                                            (batch, tgt_len, vocab)

With ``tie_embeddings`` one matrix E serves as source embedding, target embedding and output
projection (section 3.4); ``share_embeddings`` keeps one E for both stacks with a head of its
own (T5 v1.1). Source padding is derived from ``config.pad_id``. Target padding needs no mask:
pads trail the real tokens, so causal masking already hides them from every real position, and
their own outputs are dropped by the loss.

T5 (Raffel et al., 2020) is a configuration of the same model: pre-LN with RMSNorm and a final
norm, no biases, no embedding scale and no PE. Position enters as a learned bias on the
self-attention scores (:mod:`attnlab.nn.relative`), one table in the encoder (bidirectional)
and another in the decoder (causal); the scores are not divided by √d_k, and a tied output
projection sees ``hidden · d^-½`` (``scale_tied_logits``), where the paper's model scales the
embeddings by √d instead.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.nn import (
    Decoder,
    DecoderCache,
    Encoder,
    MultiHeadAttention,
    PositionalEncoding,
    RelativePositionBias,
    TokenEmbedding,
    build_positional,
    padding_mask,
    positions_from,
)


class Transformer(nn.Module):
    """Encoder–decoder Transformer built from :mod:`attnlab.nn` blocks by a ModelConfig."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "encoder-decoder":
            raise BadInput(f"Transformer needs arch='encoder-decoder', got {config.arch!r}")
        self.config = config
        d = config.d_model
        self.src_embed = TokenEmbedding(config.vocab_size, d, config.scale_embeddings)
        # One matrix for both sides when the head is tied to it (the paper, Marian) or when
        # the config says so (T5 v1.1: shared embeddings, its own head).
        shared = ((config.tie_embeddings or config.share_embeddings)
                  and config.tgt_vocab_size is None)
        self.tgt_embed = (
            self.src_embed if shared
            else TokenEmbedding(config.target_vocab_size, d, config.scale_embeddings)
        )
        # One positional encoding serves both stacks, except T5's relative bias: the encoder's
        # looks both ways, the decoder's only back, and each stack learns its own table.
        self.tgt_positional: RelativePositionBias | None = None
        if config.positional == "relative":
            self.positional = self._relative_bias(bidirectional=True)
            self.tgt_positional = self._relative_bias(bidirectional=False)
        else:
            self.positional = build_positional(
                config.positional, d, config.n_heads, config.max_len, config.rope_base,
                config.rope_scaling, config.d_k,
            )
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.lm_head = nn.Linear(d, config.target_vocab_size, bias=config.output_bias)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.weight

    def _relative_bias(self, bidirectional: bool) -> RelativePositionBias:
        c = self.config
        return RelativePositionBias(c.n_heads, c.relative_buckets, c.relative_max_distance,
                                    bidirectional)

    def _init_weights(self) -> None:
        """Xavier-uniform for projection matrices (as the Annotated Transformer does); zero
        biases; embeddings N(0, d^-1/2) so that, scaled by √d, they have unit variance."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if not self.config.scale_attention:
            # Without 1/√d_k on the scores (T5), start W_Q that much smaller instead, as T5's
            # initialisation does: the first scores then have the paper's size.
            for module in self.modules():
                if isinstance(module, MultiHeadAttention):
                    q = module.qkv.weight[: module.q_dim] if module.fused_qkv \
                        else module.q_proj.weight
                    with torch.no_grad():
                        q.mul_(module.d_k ** -0.5)
        for bias in (self.positional, self.tgt_positional):
            if isinstance(bias, RelativePositionBias):  # T5's N(0, d^-1/2)
                nn.init.normal_(bias.embedding.weight, std=self.config.d_model ** -0.5)

    # --- the three entry points ----------------------------------------------------------
    @property
    def decoder_positional(self) -> PositionalEncoding:
        """The decoder's positional encoding: its own for T5, else the one both stacks share."""
        return self.positional if self.tgt_positional is None else self.tgt_positional

    def _embed(self, embedding: TokenEmbedding, positional: PositionalEncoding, ids: Tensor,
               offset: int = 0):
        positions = positions_from(offset, ids.shape[1], ids.device)
        x = positional.embed(embedding(ids), positions)
        return self.embed_dropout(x), positions

    def encode(self, src_ids: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor]:
        """``src_ids (batch, src_len)`` -> ``memory (batch, src_len, d)``, ``src_mask``.

        ``src_mask (batch, 1, 1, src_len)`` is True at real (non-pad) source tokens.
        """
        self._check_length(src_ids, "source")
        src_mask = padding_mask(src_ids, self.config.pad_id)
        x, positions = self._embed(self.src_embed, self.positional, src_ids)
        memory = self.encoder(x, src_mask, positional=self.positional, positions=positions,
                              need_weights=need_weights)
        return memory, src_mask

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """``tgt_ids (batch, tgt_len)`` -> ``logits (batch, tgt_len, tgt_vocab)``.

        With a ``cache`` (from :meth:`new_cache`) pass only the new target tokens; positions
        continue after the ``cache.length`` tokens already decoded.
        """
        offset = 0 if cache is None else cache.length
        self._check_length(tgt_ids, "target", offset)
        positional = self.decoder_positional
        y, positions = self._embed(self.tgt_embed, positional, tgt_ids, offset)
        hidden = self.decoder(y, memory, memory_mask=src_mask, is_causal=True,
                              positional=positional, positions=positions, cache=cache,
                              need_weights=need_weights)
        if self.config.scale_tied_logits:
            # T5: E has entries of size ~1 (embeddings are not scaled up by √d), so the tied
            # projection scales the hidden state down by √d instead
            hidden = hidden * self.config.d_model ** -0.5
        return self.lm_head(hidden)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, need_weights: bool = False) -> Tensor:
        """Teacher forcing: ``src_ids (batch, src_len)``, ``tgt_ids (batch, tgt_len)`` ->
        ``logits (batch, tgt_len, tgt_vocab)``; logits[:, t] predict tgt_ids[:, t + 1]."""
        memory, src_mask = self.encode(src_ids, need_weights)
        return self.decode(tgt_ids, memory, src_mask, need_weights=need_weights)

    def new_cache(self, capacity: int = 256) -> DecoderCache:
        """An empty KV cache for incremental decoding with :meth:`decode`."""
        return DecoderCache(len(self.decoder.layers), capacity)

    def _check_length(self, ids: Tensor, what: str, offset: int = 0) -> None:
        self.config.check_length(offset + ids.shape[1], f"{what} sequence")

    # --- inspection ----------------------------------------------------------------------
    def components(self) -> OrderedDict[str, list[nn.Module]]:
        """Named groups of modules for :func:`attnlab.parameter_breakdown`."""
        embeddings: list[nn.Module] = [self.src_embed, self.positional]
        if self.tgt_positional is not None:
            embeddings.append(self.tgt_positional)
        if self.tgt_embed is not self.src_embed:
            embeddings.append(self.tgt_embed)
        if self.lm_head.weight is not self.tgt_embed.weight:
            embeddings.append(self.lm_head)
        return OrderedDict(
            [
                ("embeddings", embeddings),
                ("encoder layer (one)", [self.encoder.layers[0]]),
                ("encoder stack", [self.encoder]),
                ("decoder layer (one)", [self.decoder.layers[0]]),
                ("decoder stack", [self.decoder]),
            ]
        )


__all__ = ["Transformer"]
