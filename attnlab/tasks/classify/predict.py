"""A fine-tuned classifier's class probabilities for texts (``attnlab classify``), and its
decisions on labelled batches (the test split's report at the end of ``train classify``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.data.stream import LabelledBatch, to_device
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


@torch.no_grad()
def decisions(model: nn.Module, labelled: list[LabelledBatch]) -> tuple[list[int], list[int]]:
    """``(gold, predicted)`` class indices of every example of ``labelled``, in batch order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gold: list[int] = []
    predicted: list[int] = []
    for b in labelled:
        b = to_device(b, device)
        predicted += model(b.ids, b.token_type_ids, b.attention_mask).argmax(-1).tolist()
        gold += b.labels.tolist()
    model.train(was_training)
    return gold, predicted
