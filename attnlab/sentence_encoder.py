"""A sentence encoder: an encoder (BERT-family) model with its tokenizer, loaded once and run
on texts. ``attnlab embed``, ``serve``'s embeddings and the task commands
(:mod:`attnlab.tasks`: classify, ner, qa) load their model through :func:`load_encoder`.

Sentence embeddings follow how sentence-transformers models such as all-MiniLM-L6-v2 are
trained and meant to be used:

    u = mean_{t : mask_t = 1} h_t        (the real tokens' contextual vectors)
    e = u / ‖u‖₂                          so cos(a, b) = e_a · e_b
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.models.bert import mean_pool
from attnlab.storage import MINILM, load, minilm_path  # noqa: F401  (minilm_path: public)
from attnlab.tokenizers import WordPieceTokenizer


@dataclass
class SentenceEncoder:
    """An encoder (BERT) model, its WordPiece tokenizer and the longest input it should see;
    ``labels`` name a classifier's classes."""

    model: nn.Module
    tokenizer: WordPieceTokenizer
    max_len: int
    labels: list[str] | None = None
    path: Path | None = None  # the folder or file the model was read from


def load_encoder(spec: str | os.PathLike,
                 adapter: str | os.PathLike | None = None) -> SentenceEncoder:
    """``minilm``, a Hugging Face BERT folder, or an attnlab run/checkpoint folder (anything
    :func:`attnlab.load` reads that holds an encoder)."""
    loaded = load(spec, adapter=adapter).expect("encoder", "embed / classify")
    return SentenceEncoder(loaded.model, loaded.tokenizer, loaded.max_len,
                           loaded.config.extra.get("labels"), loaded.path)


@torch.no_grad()
def embed_sentences(enc: SentenceEncoder, sentences: list[str], batch_size: int = 32,
                    normalize: bool = True) -> Tensor:
    """``(n, d_model)`` mean-pooled (and L2-normalised) sentence vectors."""
    out = []
    for b in batches(enc, sentences, batch_size):
        h = enc.model.encode(b["ids"], b["token_type_ids"], b["attention_mask"])
        u = mean_pool(h, b["attention_mask"])
        out.append(nn.functional.normalize(u, dim=-1) if normalize else u)
    return torch.cat(out)


def batches(enc: SentenceEncoder, texts: list[str],
            batch_size: int) -> Iterator[dict[str, Tensor]]:
    """Padded ``{ids, token_type_ids, attention_mask}`` batches on the model's device."""
    device = next(enc.model.parameters()).device
    for i in range(0, len(texts), batch_size):
        batch = enc.tokenizer.batch(texts[i : i + batch_size], max_len=enc.max_len)
        yield {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def token_vectors(enc: SentenceEncoder, sentence: str) -> tuple[list[str], Tensor, Tensor]:
    """Pieces (with [CLS]/[SEP]), their input embedding rows ``E[ids]`` (static) and their
    output vectors (contextual), both ``(seq, d_model)``."""
    ids = torch.tensor([enc.tokenizer.encode_single(sentence)])
    pieces = [enc.tokenizer.backend.id_to_token(int(i)) for i in ids[0]]
    static = enc.model.embed(ids)[0]
    contextual = enc.model.encode(ids, torch.zeros_like(ids), torch.ones_like(ids))[0]
    return pieces, static, contextual
