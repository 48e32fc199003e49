"""Encoder-only models: BERT (Devlin et al., 2019), composed from the shared blocks.

    e₀     = LayerNorm(E[ids] + P[pos] + S[segment])     (batch, seq, d_model), then dropout
    h_l    = EncoderLayer(h_{l-1}, padding mask)         l = 1..N, bidirectional, post-LN, GELU
    pooled = tanh(W_p · h_N[:, 0] + b_p)                 (batch, d_model): the [CLS] summary

BERT is the paper's encoder with learned positions, a segment (sentence A/B) embedding and a
norm on the embedding sum, so the only new parts here are the embedding sum and the heads
(``config.head``):

    mlm          LN(GELU(W_t·h + b_t)) · Eᵀ + b       (batch, seq, vocab), E tied to the input
    pretraining  the mlm logits and W_n · pooled       (batch, 2): next-sentence prediction
    classify     W_c · Dropout(pooled)                 (batch, num_labels): sequence labels
    tokens       W_c · Dropout(h)                      (batch, seq, num_labels): tagging
    none         the hidden states themselves          (batch, seq, d_model)
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.nn import Encoder, LayerNorm, TokenEmbedding, build_norm, build_positional
from attnlab.nn.feedforward import ACTIVATIONS

_POOLED_HEADS = ("none", "pretraining", "classify")  # heads that read the pooled [CLS] vector


class MLMHead(nn.Module):
    """Masked-LM prediction: ``h (..., d_model)`` -> ``logits (..., vocab)``; the output matrix
    is the input embedding (tied), plus a per-token bias."""

    def __init__(self, config: ModelConfig, embedding: nn.Parameter):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.norm = LayerNorm(config.d_model, eps=config.norm_eps)
        self.weight = embedding  # shared with BERT.embed.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        return nn.functional.linear(self.norm(self.act(self.dense(h))), self.weight, self.bias)


class BERT(nn.Module):
    """Bidirectional encoder with an optional task head; see the module docstring."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "encoder":
            raise BadInput(f"BERT needs arch='encoder', got {config.arch!r}")
        if config.activation == "swiglu":
            raise BadInput("config field activation='swiglu' is not supported by BERT")
        self.config = config
        d = config.d_model
        self.embed = TokenEmbedding(config.vocab_size, d, config.scale_embeddings, init_std=0.02)
        self.positional = build_positional(config.positional, d, config.n_heads, config.max_len,
                                           config.rope_base)
        self.segment = nn.Embedding(config.type_vocab_size, d) if config.type_vocab_size else None
        self.embed_norm = (build_norm(config.norm, d, config.norm_eps, config.bias)
                           if config.embedding_norm else nn.Identity())
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        head = config.head
        self.pooler = nn.Linear(d, d) if head in _POOLED_HEADS else None
        self.mlm = MLMHead(config, self.embed.weight) if head in ("mlm", "pretraining") else None
        self.nsp = nn.Linear(d, 2) if head == "pretraining" else None
        self.classifier = (nn.Linear(d, config.num_labels) if head in ("classify", "tokens")
                           else None)
        self.head_dropout = nn.Dropout(config.dropout)
        self._init_weights()

    def _init_weights(self) -> None:
        """BERT's scheme: N(0, 0.02) for every matrix and embedding, zero biases, unit gains."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    # --- the encoder -----------------------------------------------------------------------
    def embeddings(self, ids: Tensor, token_type_ids: Tensor | None = None,
                   positions: Tensor | None = None) -> Tensor:
        """``LN(E[ids] + P[pos] + S[segment])``, before dropout: ``(batch, seq, d_model)``."""
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.positional.embed(self.embed(ids), positions)
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            x = x + self.segment(token_type_ids)
        return self.embed_norm(x)

    def encode(self, ids: Tensor, token_type_ids: Tensor | None = None,
               attention_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """Contextual vectors ``(batch, seq, d_model)`` for ``ids (batch, seq)``.

        ``attention_mask (batch, seq)``: True/1 at real tokens, False/0 at padding; padded keys
        get no attention (the mask's rows broadcast over queries and heads).
        """
        self.config.check_length(ids.shape[1])
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed_dropout(self.embeddings(ids, token_type_ids, positions))
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        return self.encoder(x, mask=mask, positional=self.positional, positions=positions,
                            need_weights=need_weights)

    def pool(self, hidden: Tensor) -> Tensor:
        """``tanh(W_p · h[:, 0] + b_p)``: ``(batch, seq, d)`` -> ``(batch, d)``."""
        if self.pooler is None:
            raise ValueError(f"head={self.config.head!r} has no pooler")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, need_weights: bool = False,
                masked_positions: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The head's output (module docstring); ``(mlm, nsp)`` logits for ``pretraining``.

        ``masked_positions (batch, seq)`` bool: the mlm logits only where it is True,
        ``(n_selected, vocab)`` — pretraining predicts ~15% of positions, so the vocabulary
        projection (the largest matmul) shrinks ~7x.
        """
        h = self.encode(ids, token_type_ids, attention_mask, need_weights)
        head = self.config.head
        if head == "none":
            return h
        if head in ("mlm", "pretraining"):
            logits = self.mlm(h if masked_positions is None else h[masked_positions])
            return logits if head == "mlm" else (logits, self.nsp(self.pool(h)))
        if head == "classify":
            return self.classifier(self.head_dropout(self.pool(h)))
        return self.classifier(self.head_dropout(h))  # tokens

    def components(self) -> OrderedDict[str, list[nn.Module]]:
        embeddings = [m for m in (self.embed, self.positional, self.segment, self.embed_norm)
                      if m is not None]
        parts = OrderedDict([("embeddings", embeddings),
                             ("encoder layer (one)", [self.encoder.layers[0]]),
                             ("encoder", [self.encoder])])
        heads = [m for m in (self.pooler, self.mlm, self.nsp, self.classifier) if m is not None]
        if heads:
            parts["pooler and heads"] = heads
        return parts


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Average of the real tokens' vectors: ``(batch, seq, d)``, ``(batch, seq)`` -> ``(batch,
    d)`` (the pooling all-MiniLM-L6-v2 and other sentence-transformers models are trained
    with)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
