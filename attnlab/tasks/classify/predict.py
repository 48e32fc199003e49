"""A fine-tuned classifier's class probabilities for texts (``attnlab classify``)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import BadInput
from attnlab.sentence_encoder import SentenceEncoder, batches


@torch.no_grad()
def classify_texts(enc: SentenceEncoder, texts: list[str], batch_size: int = 32) -> Tensor:
    """Class probabilities ``(n, num_labels)`` from a ``head='classify'`` model."""
    if enc.model.config.head != "classify":
        raise BadInput(f"model has head={enc.model.config.head!r}, not 'classify'")
    probs = []
    for b in batches(enc, texts, batch_size):
        logits = enc.model(b["ids"], b["token_type_ids"], b["attention_mask"])
        probs.append(logits.float().softmax(-1))
    return torch.cat(probs)
