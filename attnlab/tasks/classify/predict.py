"""A fine-tuned classifier's class probabilities for texts, pairs of texts or long documents
(``attnlab classify``, ``evaluate classify``), and its decisions on labelled batches (the test
split's report at the end of ``train classify``).

A run of ``train classify`` records how it read its input in ``config.extra["reading"]``:
``pair_field`` (pairs), ``truncation``, ``pool`` with ``max_len`` and ``stride`` (windows,
:mod:`attnlab.tasks.classify.windows`). Prediction reads the same way unless told otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.data.stream import LabelledBatch, to_device
from attnlab.errors import BadInput
from attnlab.sentence_encoder import SentenceEncoder, batches
from attnlab.tasks.classify.data import Example, collate_pairs, encode_pairs
from attnlab.tasks.classify.windows import (
    check_windows,
    collate_windows,
    default_stride,
    encode_windows,
    pool_logits,
)


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


def batch_logits(model: nn.Module, b, pool: str | None = None) -> Tensor:
    """``(examples, num_labels)``: the logits of a batch, a document's windows pooled."""
    logits = model(b.ids, b.token_type_ids, b.attention_mask)
    return logits if pool is None else pool_logits(logits, b.windows, pool)


@torch.no_grad()
def decisions(model: nn.Module, labelled: list[LabelledBatch],
              pool: str | None = None) -> tuple[list[int], list[int]]:
    """``(gold, predicted)`` class indices of every example of ``labelled``, in batch order
    (``pool``: batches of windows, :mod:`attnlab.tasks.classify.windows`)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gold: list[int] = []
    predicted: list[int] = []
    for b in labelled:
        b = to_device(b, device)
        predicted += batch_logits(model, b, pool).argmax(-1).tolist()
        gold += b.labels.tolist()
    model.train(was_training)
    return gold, predicted


@torch.no_grad()
def classify_examples(enc: SentenceEncoder, examples: list[Example], batch_size: int = 32,
                      pool: str | None = None, stride: int | None = None,
                      truncation: str | None = None) -> Tensor:
    """Class probabilities ``(n, num_labels)`` of texts, pairs (``Example.pair``) or, with
    ``pool``, documents read in windows; what is not given is as the run trained (module
    docstring). Pairs are cut to the model's longest input."""
    if enc.model.config.head != "classify":
        raise BadInput(f"model has head={enc.model.config.head!r}, not 'classify'")
    trained = enc.model.config.extra.get("reading", {})
    pairs = [e.pair is not None for e in examples]
    if trained.get("pair_field") and not all(pairs):
        raise BadInput(f"the model was trained on pairs (--pair-field "
                       f"{trained['pair_field']}): give each text with its pair")
    pool = pool or trained.get("pool")
    if stride is not None and not pool:
        raise BadInput("a stride is the overlap of windows: it needs a pool (--pool)")
    if pool and enc.model.config.reads_long_documents:
        raise BadInput("--pool reads a long text in windows; this Longformer model reads the "
                       "whole document (its attention_window): leave --pool out")
    if any(pairs):
        if pool:
            raise BadInput("windows (--pool) read single texts, not pairs")
        rows: list = encode_pairs(examples, enc.tokenizer, None, enc.max_len,
                                  truncation or trained.get("truncation", "longest_first"))
        collate = collate_pairs
    elif pool:
        max_len = min(trained.get("max_len", enc.max_len), enc.max_len)
        stride = stride if stride is not None else trained.get("stride", default_stride(max_len))
        check_windows(max_len, stride)
        rows = encode_windows(examples, enc.tokenizer, None, max_len, stride)
        collate = collate_windows
    else:
        return classify_texts(enc, [e.text for e in examples], batch_size)
    device = next(enc.model.parameters()).device
    probs = []
    for i in range(0, len(rows), batch_size):
        b = to_device(collate(rows[i : i + batch_size], enc.tokenizer.pad_id), device)
        probs.append(batch_logits(enc.model, b, pool).float().softmax(-1))
    return torch.cat(probs)
