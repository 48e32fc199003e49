"""Multiple-choice questions answered by an encoder with a multiple-choice head
(``head="choice"``, :mod:`attnlab.models.bert`), as transformers' ``BertForMultipleChoice``
answers them: each choice is read with the question's context as a pair, and scores one logit

    pair_i    = [CLS] context [SEP] choice_i [SEP]         the family's pair format
    logit_i   = w · Dropout(tanh(W_p · h_i[CLS] + b_p)) + b
    predicted = argmax_i logit_i                           the first of equal ones

A question's pairs are cut to ``max_len`` tokens as transformers' tokenizers cut a pair
(``truncation``: ``longest_first`` or ``only_second``). The ``instruction`` field is not read.

A batch is ``(questions, choices, seq)``, ``choices`` the most any of its questions has. A
question with fewer is filled up with copies of its first pair, marked absent (``present``
False): their logits are −∞, so they take no probability and are never predicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.data.labelled import LabelledBatches, padded
from attnlab.data.stream import to_device
from attnlab.tasks.choice.data import Example
from attnlab.tasks.choice.harness import argmax

Pair = tuple[list[int], list[int]]  # ids, token types


class ChoiceBatch(NamedTuple):
    ids: Tensor  # (questions, choices, seq)
    token_type_ids: Tensor  # (questions, choices, seq)
    attention_mask: Tensor  # (questions, choices, seq), 1 at real tokens
    labels: Tensor  # (questions,): the right choice
    present: Tensor  # (questions, choices) bool: False where a question has no such choice


def encode_question(tokenizer, example: Example, max_len: int,
                    truncation: str = "longest_first") -> list[Pair]:
    """Each choice's ``(ids, token_types)``, paired with the context and cut to ``max_len``."""
    return [tokenizer.encode_pair(example.context, c, max_len, truncation)
            for c in example.choices]


def question_rows(examples: Sequence[Example], tokenizer, max_len: int,
                  truncation: str = "longest_first") -> list[tuple[list[Pair], int]]:
    """``(pairs, answer)`` of each question."""
    return [(encode_question(tokenizer, e, max_len, truncation), e.answer) for e in examples]


def collate_questions(rows: list[tuple[list[Pair], int]], pad_id: int) -> ChoiceBatch:
    width = max(len(pairs) for pairs, _ in rows)
    filled = [pairs + [pairs[0]] * (width - len(pairs)) for pairs, _ in rows]
    ids, mask = padded([p[0] for pairs in filled for p in pairs], pad_id)
    types, _ = padded([p[1] for pairs in filled for p in pairs], 0)
    present = torch.tensor([[k < len(pairs) for k in range(width)] for pairs, _ in rows])
    shape = (len(rows), width, ids.shape[-1])
    return ChoiceBatch(ids.view(shape), types.view(shape), mask.view(shape),
                       torch.tensor([answer for _, answer in rows]), present)


def fixed_question_batches(rows, batch_size: int, pad_id: int) -> list[ChoiceBatch]:
    """Evaluation batches in a fixed order, by the longest pair of each question."""
    order = sorted(range(len(rows)), key=lambda i: max(len(p[0]) for p in rows[i][0]))
    return [collate_questions([rows[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class QuestionBatches(LabelledBatches):
    """Endless shuffled training batches of questions, as :class:`LabelledBatches` draws
    them."""

    @staticmethod
    def collate(rows: list, pad_id: int) -> ChoiceBatch:
        return collate_questions(rows, pad_id)


def choice_logits(model: nn.Module, batch: ChoiceBatch) -> Tensor:
    """``(questions, choices)``: the head's logits, −∞ where a question has no such choice."""
    logits = model(batch.ids, batch.token_type_ids, batch.attention_mask).float()
    return logits.masked_fill(~batch.present, float("-inf"))


def reading(model: nn.Module, max_len: int) -> tuple[int, str]:
    """``(max_len, truncation)``: as the run trained (``config.extra["reading"]``), its
    ``max_len`` capped at ``max_len``; for a model from elsewhere, ``max_len`` and
    ``longest_first``."""
    trained = model.config.extra.get("reading", {})
    return min(trained.get("max_len", max_len), max_len), trained.get("truncation",
                                                                       "longest_first")


@torch.no_grad()
def score_questions(model: nn.Module, tokenizer, examples: Sequence[Example], max_len: int,
                    truncation: str = "longest_first",
                    batch_size: int = 16) -> list[list[float]]:
    """Each question's logits, one a choice, in the order of ``examples``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rows = question_rows(examples, tokenizer, max_len, truncation)
    scores: list[list[float]] = []
    for s in range(0, len(rows), batch_size):
        part = rows[s : s + batch_size]
        logits = choice_logits(model, to_device(collate_questions(part, tokenizer.pad_id),
                                                device))
        scores += [row[: len(pairs)] for row, (pairs, _) in zip(logits.tolist(), part,
                                                                strict=True)]
    model.train(was_training)
    return scores


def decisions(scores: Sequence[Sequence[float]]) -> list[int]:
    """The predicted choice of each question: its largest logit, the first of equal ones."""
    return [argmax(s) for s in scores]


__all__ = ["ChoiceBatch", "encode_question", "question_rows", "collate_questions",
           "fixed_question_batches", "QuestionBatches", "choice_logits", "reading",
           "score_questions", "decisions"]
