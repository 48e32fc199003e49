"""Answering questions with a fine-tuned span head, and SQuAD's scores.

    logits    s = h·w_s,  e = h·w_e                           (batch, seq) each: BERT's qa head
    answer    argmax over i ≤ j < i + L of s_i + e_j, over context tokens of every window

The best span of all windows (:func:`attnlab.tasks.qa.data.windows`) is the answer, and its
character offsets give the text. As transformers' ``run_qa.py`` does, only the ``n_best``
highest start and end logits of a window are paired.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import torch
from torch import nn

from attnlab.data.labelled import padded
from attnlab.sentence_encoder import SentenceEncoder
from attnlab.tasks.qa.data import Question, Window, check_window, windows


def reading_window(enc: SentenceEncoder, max_len: int | None = None,
                   stride: int | None = None) -> tuple[int, int]:
    """``(max_len, stride)`` of the windows ``attnlab qa`` reads with: those given, else the
    run's (``train qa`` records them), else 384 tokens (at most the encoder's) and a third
    of that; checked against the model's positions (:func:`check_window`)."""
    config = enc.model.config
    window = config.extra.get("qa_window", {})
    max_len = max_len or window.get("max_len") or min(384, enc.max_len)
    stride = window.get("stride", max_len // 3) if stride is None else stride
    check_window(max_len, stride, config.max_len - config.position_offset)
    return max_len, stride


def best_span(start: torch.Tensor, end: torch.Tensor, window: Window, n_best: int = 20,
              max_answer_len: int = 30) -> tuple[float, int, int] | None:
    """``(score, first_char, end_char)`` of the best context span of one window: the
    ``n_best`` highest start and end logits paired with end ≥ start and at most
    ``max_answer_len`` tokens; None when no pair qualifies."""
    k = min(n_best, start.numel())
    best = None
    for i in start.topk(k).indices.tolist():
        for j in end.topk(k).indices.tolist():
            if window.spans[i] is None or window.spans[j] is None:
                continue
            if j < i or j - i + 1 > max_answer_len:
                continue
            score = float(start[i] + end[j])
            if best is None or score > best[0]:
                best = (score, window.spans[i][0], window.spans[j][1])
    return best


@torch.no_grad()
def answer(model: nn.Module, tokenizer, question: str, context: str, max_len: int = 384,
           stride: int = 128, max_answer_len: int = 30, n_best: int = 20,
           batch_size: int = 16) -> tuple[str, float, int, int]:
    """The answer to ``question`` in ``context``: ``(text, score, start_char, end_char)``
    (the empty answer with score -inf when no window offers a span)."""
    found = answer_many(model, tokenizer, [(question, context)], max_len, stride,
                        max_answer_len, n_best, batch_size)
    return found[0]


@torch.no_grad()
def answer_many(model: nn.Module, tokenizer, pairs: list[tuple[str, str]], max_len: int = 384,
                stride: int = 128, max_answer_len: int = 30, n_best: int = 20,
                batch_size: int = 16) -> list[tuple[str, float, int, int]]:
    """:func:`answer` for many ``(question, context)`` pairs, their windows run in batches."""
    device = next(model.parameters()).device
    items = [(n, w) for n, (q, c) in enumerate(pairs) for w in windows(tokenizer, q, c,
                                                                       max_len, stride)]
    best: list[tuple[float, int, int] | None] = [None] * len(pairs)
    for at in range(0, len(items), batch_size):
        chunk = items[at : at + batch_size]
        ids, mask = padded([w.ids for _, w in chunk], tokenizer.pad_id)
        types, _ = padded([w.types for _, w in chunk], 0)
        start, end = model(ids.to(device), types.to(device), mask.to(device))
        for row, (n, w) in enumerate(chunk):
            length = len(w.ids)
            span = best_span(start[row, :length].float().cpu(), end[row, :length].float().cpu(),
                             w, n_best, max_answer_len)
            if span is not None and (best[n] is None or span[0] > best[n][0]):
                best[n] = span
    out = []
    for (_, context), b in zip(pairs, best, strict=True):
        out.append(("", float("-inf"), 0, 0) if b is None
                   else (context[b[1] : b[2]], b[0], b[1], b[2]))
    return out


# --- scores ----------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD's official normalisation: lower-case, punctuation removed, the articles a, an
    and the removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_scores(predictions: list[str], answers: list[list[str]]) -> tuple[float, float]:
    """``(exact_match, f1)`` in percent, as SQuAD v1.1's evaluation script computes them: per
    question the best over its reference answers of exact match of the normalised strings,
    and of the F1 of their words (counted with multiplicity); then the mean."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} questions")

    def f1(pred: str, ref: str) -> float:
        p, r = normalize_answer(pred).split(), normalize_answer(ref).split()
        same = sum((Counter(p) & Counter(r)).values())
        if same == 0:
            return 0.0
        precision, recall = same / len(p), same / len(r)
        return 2 * precision * recall / (precision + recall)

    em = sum(max(normalize_answer(p) == normalize_answer(a) for a in refs)
             for p, refs in zip(predictions, answers, strict=True))
    f = sum(max(f1(p, a) for a in refs) for p, refs in zip(predictions, answers, strict=True))
    n = max(len(predictions), 1)
    return 100 * em / n, 100 * f / n


def score_questions(model: nn.Module, tokenizer, questions: list[Question], max_len: int,
                    stride: int, max_answer_len: int = 30,
                    batch_size: int = 16) -> tuple[float, float, list[str]]:
    """``(exact_match, f1, answers)``: the model answers every question
    (:func:`answer_many`), scored against its reference answers (:func:`squad_scores`)."""
    model.eval()
    found = answer_many(model, tokenizer, [(q.question, q.context) for q in questions],
                        max_len, stride, max_answer_len, batch_size=batch_size)
    answers = [text for text, *_ in found]
    em, f1 = squad_scores(answers, [list(q.answers) for q in questions])
    return em, f1, answers
