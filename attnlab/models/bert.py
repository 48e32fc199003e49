"""Encoder-only models: BERT (Devlin et al., 2019) and its descendants, composed from the
shared blocks. RoBERTa, ALBERT, DistilBERT and ELECTRA are configurations of this one model.

    e₀     = LN(E[ids] + P[pos] + S[segment])        (batch, seq, E), then dropout
    x₀     = W_e · e₀ + b_e                          (batch, seq, d_model), when E ≠ d_model
    h_l    = EncoderLayer(h_{l-1}, padding mask)     l = 1..N, bidirectional, post-LN, GELU
    pooled = tanh(W_p · h_N[:, 0] + b_p)             (batch, d_model): the [CLS] summary

BERT is the paper's encoder with learned positions, a segment (sentence A/B) embedding and a
norm on the embedding sum; the descendants differ only in knobs of the config:

    embedding_size   E < d_model: factorised embeddings, lifted by W_e (ALBERT, ELECTRA)
    share_layers     one layer's weights for all N layers (ALBERT)
    position_offset  pos = offset, offset + 1, … over the non-pad tokens, pad_id at pads
                     (RoBERTa: offset = pad_id + 1); 0: pos = 0, 1, …
    type_vocab_size  0: no segment embedding S (DistilBERT)
    pooler           False: no tanh pooler (DistilBERT, ELECTRA)
    attention_window each layer attends a band of W tokens and the global tokens, which have
                     projections of their own (Longformer: nn/longformer.py)

The heads (``config.head``):

    mlm            LN_E(act(W_t·h + b_t)) · Eᵀ + b  (batch, seq, vocab), E tied to the input;
                   W_t maps d_model → E, so a factorised model predicts in E dimensions
    pretraining    the mlm logits and W_n · pooled   (batch, 2): next-sentence (ALBERT:
                   sentence-order) prediction
    classify       W_c · Dropout(pooled)             (batch, num_labels): sequence labels
    choice         w_c · Dropout(pooled) + b_c       ids (batch, choices, seq) read as
                   batch·choices sequences, one logit each, then (batch, choices): a
                   multiple-choice question, each choice paired with its context
    tokens         W_c · Dropout(h)                  (batch, seq, num_labels): tagging
    qa             W_s · h  split into start, end    (batch, seq) each: extractive question
                   answering's span logits (an answer runs from argmax start to end)
    discriminator  w · act(W_d·h + b_d) + c          (batch, seq): ELECTRA's "was this token
                   replaced?" logit per position
    none           the hidden states themselves      (batch, seq, d_model)
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from attnlab.config import POOLED_HEADS, ModelConfig
from attnlab.errors import BadInput
from attnlab.nn import Encoder, LayerNorm, TokenEmbedding, build_norm, build_positional
from attnlab.nn.feedforward import ACTIVATIONS
from attnlab.nn.longformer import LongformerMask, LongformerSelfAttention
from attnlab.nn.packing import Packing


class MLMHead(nn.Module):
    """Masked-LM prediction: ``h (..., d_model)`` -> ``logits (..., vocab)``; the output matrix
    is the input embedding (tied, ``(vocab, E)``), plus a per-token bias."""

    def __init__(self, config: ModelConfig, embedding: nn.Parameter):
        super().__init__()
        width = embedding.shape[1]  # E: the transform ends where the embedding lives
        self.dense = nn.Linear(config.d_model, width)
        self.act = ACTIVATIONS[config.activation]
        self.norm = LayerNorm(width, eps=config.norm_eps)
        self.weight = embedding  # shared with BERT.embed.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        return nn.functional.linear(self.norm(self.act(self.dense(h))), self.weight, self.bias)


class DiscriminatorHead(nn.Module):
    """ELECTRA's replaced-token detection: ``h (..., d_model)`` -> one logit per position
    ``(...)``, ``w · act(W_d·h + b_d) + c``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.out = nn.Linear(config.d_model, 1)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.act(self.dense(h))).squeeze(-1)


class BERT(nn.Module):
    """Bidirectional encoder with an optional task head; see the module docstring."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        _check(config)
        self.config = config
        d, head = config.d_model, config.head
        e = config.embedding_size or d
        self.embed = TokenEmbedding(config.vocab_size, e, config.scale_embeddings, init_std=0.02)
        self.positional = build_positional(config.positional, e, config.n_heads, config.max_len,
                                           config.rope_base)
        self.segment = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        self.embed_norm = (build_norm(config.norm, e, config.norm_eps, config.bias)
                           if config.embedding_norm else nn.Identity())
        self.embed_dropout = nn.Dropout(config.dropout)
        # ALBERT's embedding_hidden_mapping_in, ELECTRA's embeddings_project
        self.embed_proj = nn.Linear(e, d) if config.embedding_size else None
        self.encoder = Encoder(config)  # config.share_layers: one layer object, N times
        for i, window in enumerate(config.attention_windows or []):  # Longformer's band
            self.encoder.layers[i].self_attn = LongformerSelfAttention(
                d, config.n_heads, window, config.bias, config.attention_dropout)
        self.pooler = nn.Linear(d, d) if config.pooler and head in POOLED_HEADS else None
        self.mlm = MLMHead(config, self.embed.weight) if head in ("mlm", "pretraining") else None
        self.nsp = nn.Linear(d, 2) if head == "pretraining" else None
        self.classifier = (nn.Linear(d, config.num_labels) if head in ("classify", "tokens")
                           else nn.Linear(d, 1) if head == "choice" else None)
        self.discriminator = DiscriminatorHead(config) if head == "discriminator" else None
        self.qa = nn.Linear(d, 2) if head == "qa" else None  # transformers' qa_outputs
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
    def positions(self, ids: Tensor) -> Tensor:
        """``(seq,)`` positions 0, 1, …; with ``position_offset`` (RoBERTa), ``(batch, seq)``:
        the real tokens count up from the offset and every pad takes ``pad_id``, so a pad
        neither moves the positions of the tokens after it nor reads a real position."""
        offset = self.config.position_offset
        if not offset:
            return torch.arange(ids.shape[1], device=ids.device)
        real = ids != self.config.pad_id
        return torch.where(real, real.cumsum(1) + (offset - 1), self.config.pad_id)

    def embeddings(self, ids: Tensor, token_type_ids: Tensor | None = None,
                   positions: Tensor | None = None) -> Tensor:
        """``LN(E[ids] + P[pos] + S[segment])``, before dropout and the lift to d_model:
        ``(batch, seq, E)``."""
        if positions is None:
            positions = self.positions(ids)
        x = self.positional.embed(self.embed(ids), positions)
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            x = x + self.segment(token_type_ids)
        return self.embed_norm(x)

    def embed_inputs(self, ids: Tensor, token_type_ids: Tensor | None = None,
                     positions: Tensor | None = None) -> Tensor:
        """What the first layer reads: :meth:`embeddings` after dropout, lifted by ``W_e`` when
        E ≠ d_model: ``(batch, seq, d_model)``."""
        x = self.embed_dropout(self.embeddings(ids, token_type_ids, positions))
        return x if self.embed_proj is None else self.embed_proj(x)

    def encode(self, ids: Tensor, token_type_ids: Tensor | None = None,
               attention_mask: Tensor | None = None, need_weights: bool = False,
               global_attention_mask: Tensor | None = None) -> Tensor:
        """Contextual vectors ``(batch, seq, d_model)`` for ``ids (batch, seq)``.

        ``attention_mask (batch, seq)``: True/1 at real tokens, False/0 at padding; padded keys
        get no attention (the mask's rows broadcast over queries and heads).
        ``global_attention_mask (batch, seq)``: a Longformer's global tokens (True/1).
        """
        offset = self.config.position_offset  # RoBERTa's first rows of P belong to no token
        if offset and ids.shape[1] + offset > self.config.max_len:
            raise BadInput(f"sequence of {ids.shape[1]} tokens exceeds the model's context of "
                           f"{self.config.max_len - offset} tokens (max_len="
                           f"{self.config.max_len} positions, the first {offset} unused)")
        self.config.check_length(ids.shape[1])
        positions = self.positions(ids)
        x = self.embed_inputs(ids, token_type_ids, positions)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        # training computes nothing for padding (nn/packing.py); outputs at padded positions
        # are then zeros, which no loss reads (the span loss leaves padding out of its
        # softmax); inference keeps the padded layout, whose padded rows match transformers'
        packing = Packing.of(attention_mask) if self.training and not need_weights else None
        if self.config.attention_window is not None:  # Longformer: the band and global tokens
            mask, packing = LongformerMask.of(ids, attention_mask, global_attention_mask), None
        return self.encoder(x, mask=mask, positional=self.positional, positions=positions,
                            need_weights=need_weights, packing=packing)

    def pool(self, hidden: Tensor) -> Tensor:
        """``tanh(W_p · h[:, 0] + b_p)``: ``(batch, seq, d)`` -> ``(batch, d)``."""
        if self.pooler is None:
            raise ValueError(f"head={self.config.head!r} has no pooler")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, need_weights: bool = False,
                masked_positions: Tensor | None = None,
                global_attention_mask: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The head's output (module docstring); ``(mlm, nsp)`` logits for ``pretraining``,
        ``(start, end)`` for ``qa``; for ``choice`` the inputs are ``(batch, choices, seq)``.

        ``masked_positions (batch, seq)`` bool: the mlm logits only where it is True,
        ``(n_selected, vocab)`` — pretraining predicts ~15% of positions, so the vocabulary
        projection (the largest matmul) shrinks ~7x. ``global_attention_mask``: a Longformer's
        global tokens; None: :meth:`default_global`.
        """
        head = self.config.head
        if global_attention_mask is None:
            global_attention_mask = self.default_global(ids)
        if head == "choice":  # every (context, choice) pair on its own, as one sequence
            shape = ids.shape[:2]
            ids, token_type_ids, attention_mask = (
                None if t is None else t.flatten(0, 1)
                for t in (ids, token_type_ids, attention_mask))
            h = self.encode(ids, token_type_ids, attention_mask, need_weights)
            return self.classifier(self.head_dropout(self.pool(h))).view(shape)
        h = self.encode(ids, token_type_ids, attention_mask, need_weights, global_attention_mask)
        if head == "none":
            return h
        if head in ("mlm", "pretraining"):
            logits = self.mlm(h if masked_positions is None else h[masked_positions])
            return logits if head == "mlm" else (logits, self.nsp(self.pool(h)))
        if head == "classify":
            return self.classifier(self.head_dropout(self.pool(h)))
        if head == "discriminator":
            return self.discriminator(h)
        if head == "qa":
            start, end = self.qa(h).unbind(-1)
            return start, end
        return self.classifier(self.head_dropout(h))  # tokens

    def default_global(self, ids: Tensor) -> Tensor | None:
        """A Longformer's global tokens when none are given, as transformers chooses them
        for the head: [CLS] for ``classify``, the question (every token before the first
        separator, ``eos_id``) for ``qa``; otherwise none (and none without a window)."""
        head = self.config.head
        if self.config.attention_window is None or head not in ("classify", "qa"):
            return None
        position = torch.arange(ids.shape[1], device=ids.device)[None]
        if head == "classify":
            return (position == 0).expand_as(ids)
        sep = ids == self.config.eos_id
        return position < torch.where(sep.any(1), sep.int().argmax(1), 0)[:, None]

    def components(self) -> OrderedDict[str, list[nn.Module]]:
        embeddings = [m for m in (self.embed, self.positional, self.segment, self.embed_norm,
                                  self.embed_proj) if m is not None]
        parts = OrderedDict([("embeddings", embeddings),
                             ("encoder layer (one)", [self.encoder.layers[0]]),
                             ("encoder", [self.encoder])])
        heads = [m for m in (self.pooler, self.mlm, self.nsp, self.classifier,
                             self.discriminator, self.qa) if m is not None]
        if heads:
            parts["pooler and heads"] = heads
        return parts


def _check(config: ModelConfig) -> None:
    """What this model cannot build, as one line each."""
    if config.arch != "encoder":
        raise BadInput(f"BERT needs arch='encoder', got {config.arch!r}")
    if config.activation == "swiglu":
        raise BadInput("config field activation='swiglu' is not supported by BERT")
    if config.embedding_size and config.positional != "learned":
        # the factorised models add learned positions in E dims; a rotation acts on the heads
        raise BadInput(f"config: embedding_size needs positional='learned', got "
                       f"{config.positional!r}")
    if config.attention_window is not None and (config.share_layers or config.pruned_heads
                                                or config.positional in ("rope", "alibi")):
        raise BadInput("config: attention_window (Longformer) needs a layer of its own each, "
                       "unpruned, and positions added to the embeddings")
    if not config.pooler and config.head in ("pretraining", "classify", "choice"):
        raise BadInput(f"config: head={config.head!r} reads the pooled [CLS] vector, but "
                       "pooler=False")


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Average of the real tokens' vectors: ``(batch, seq, d)``, ``(batch, seq)`` -> ``(batch,
    d)`` (the pooling all-MiniLM-L6-v2 and other sentence-transformers models are trained
    with)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
