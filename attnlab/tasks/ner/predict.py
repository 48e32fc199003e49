"""Tagging words with a fine-tuned model, reading entities from tags, and scoring them.

    logits    (batch, seq, num_labels) from BERT's ``tokens`` head; a word's tag is the argmax
              at its first piece

Entities are read from tags as conlleval and seqeval's default mode read them
(:func:`entities`), and scored at the entity level (:func:`entity_scores`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.data.labelled import padded
from attnlab.tasks.ner.data import Sentence, word_pieces


def entities(tags: list[str] | tuple[str, ...]) -> list[tuple[str, int, int]]:
    """Entity spans ``(type, start, end)`` (``end`` exclusive) of a BIO tag sequence.

    ``B-X`` always begins an entity; ``I-X`` continues the entity before it if that one is of
    type X, otherwise it begins one; ``O`` ends any entity.
    """
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, name = tag.partition("-")
        if kind is not None and (prefix != "I" or name != kind):  # the open entity ends
            spans.append((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = name, i
    if kind is not None:
        spans.append((kind, start, len(tags)))
    return spans


@torch.no_grad()
def predict_tags(model: nn.Module, tokenizer, sentences: list[list[str]],
                 batch_size: int = 32, max_len: int | None = None) -> list[list[str]]:
    """The tag of every word of every sentence: the argmax of the ``tokens`` head's logits at
    the word's first piece, named by ``model.config.extra["labels"]``."""
    labels = model.config.extra.get("labels") or [str(i) for i in range(model.config.num_labels)]
    max_len = max_len or model.config.max_len - model.config.position_offset
    device = next(model.parameters()).device
    chunks = [(s, c) for s, parts in enumerate(word_pieces(tokenizer, sentences, max_len))
              for c in parts]
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i][1].ids))  # little padding
    tags = [["O"] * len(words) for words in sentences]
    for start in range(0, len(order), batch_size):
        batch = [chunks[i] for i in order[start : start + batch_size]]
        ids, mask = padded([c.ids for _, c in batch], tokenizer.pad_id)
        best = model(ids.to(device), attention_mask=mask.to(device)).argmax(-1).cpu()
        for row, (s, chunk) in enumerate(batch):
            for pos, word in chunk.first_pieces():
                tags[s][word] = labels[int(best[row, pos])]
    return tags


def split_words(tokenizer, text: str) -> list[tuple[str, int, int]]:
    """``(word, start, end)`` character spans of ``text`` as the tokenizer's pre-tokenizer
    splits it (BERT: whitespace, then punctuation on its own)."""
    pre = tokenizer.backend.pre_tokenizer
    if pre is None:
        return [(w, 0, 0) for w in text.split()]
    return [(w, a, b) for w, (a, b) in pre.pre_tokenize_str(text)]


def tag_text(model: nn.Module, tokenizer, text: str) -> list[tuple[str, str, int, int]]:
    """The entities of a raw text: ``(type, text, start, end)`` with character offsets."""
    words = split_words(tokenizer, text)
    if not words:
        return []
    tags = predict_tags(model, tokenizer, [[w for w, _, _ in words]])[0]
    return [(kind, text[words[a][1] : words[b - 1][2]], words[a][1], words[b - 1][2])
            for kind, a, b in entities(tags)]


# --- scores ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EntityScores:
    """Entity-level scores (CoNLL-2003's, as conlleval and seqeval report them): an entity
    counts as found only when its type and both boundaries match."""

    precision: float
    recall: float
    f1: float
    found: int  # entities predicted
    expected: int  # entities in the references
    correct: int
    per_type: dict[str, tuple[float, float, float, int]]  # type -> (P, R, F1, expected)


def entity_scores(gold: list[list[str]], pred: list[list[str]]) -> EntityScores:
    """P = correct / predicted, R = correct / expected, F1 = 2PR / (P + R), over every
    sentence's entities (:func:`entities`: seqeval's default mode), micro-averaged;
    ``per_type`` gives the same for each entity type."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} reference sentences but {len(pred)} predicted")
    true_spans, pred_spans = set(), set()
    for n, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(g)} reference tags but {len(p)} predicted")
        true_spans |= {(n, *e) for e in entities(g)}
        pred_spans |= {(n, *e) for e in entities(p)}

    def prf(t: set, p: set) -> tuple[float, float, float]:
        c = len(t & p)
        precision = c / len(p) if p else 0.0
        recall = c / len(t) if t else 0.0
        f1 = 2 * precision * recall / (precision + recall) if c else 0.0
        return precision, recall, f1

    types = sorted({e[1] for e in true_spans | pred_spans})
    per_type = {}
    for kind in types:
        t = {e for e in true_spans if e[1] == kind}
        per_type[kind] = (*prf(t, {e for e in pred_spans if e[1] == kind}), len(t))
    return EntityScores(*prf(true_spans, pred_spans), len(pred_spans), len(true_spans),
                        len(true_spans & pred_spans), per_type)


def score(model: nn.Module, tokenizer, sentences: list[Sentence], batch_size: int = 32,
          max_len: int | None = None) -> EntityScores:
    """The entity scores of ``model``'s tags for ``sentences`` against their own tags (what
    ``train ner`` reports for dev and test, and ``evaluate ner`` for a file)."""
    pred = predict_tags(model, tokenizer, [list(s.words) for s in sentences], batch_size,
                        max_len)
    return entity_scores([list(s.tags) for s in sentences], pred)
