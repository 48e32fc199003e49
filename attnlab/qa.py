"""Extractive question answering (SQuAD; Devlin et al., 2019, section 4.2): the answer is a
span of the context, read from two logits per token.

    input     [CLS] question [SEP] context window [SEP]        token types 0 … 0 1 … 1
    logits    s = h·w_s,  e = h·w_e                           (batch, seq) each: BERT's qa head
    answer    argmax over i ≤ j < i + L of s_i + e_j, over context tokens of every window

A context longer than the model's window is read in windows of ``max_len`` tokens whose
context parts overlap by ``stride`` tokens, as transformers' tokenizers cut them
(``truncation="only_second", return_overflowing_tokens=True, stride=...``); the best span
of all windows is the answer, and its character offsets give the text. As transformers'
``run_qa.py`` does, only the ``n_best`` highest start and end logits of a window are paired.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.errors import BadInput
from attnlab.tagging import padded


@dataclass(frozen=True)
class Window:
    """One window of a question and its context: ``ids`` and ``types`` ``(seq,)``, and for
    each token its character span in the context (None outside the context)."""

    ids: list[int]
    types: list[int]
    spans: list[tuple[int, int] | None]

    def position_of(self, start_char: int, end_char: int) -> tuple[int, int] | None:
        """The tokens holding characters ``[start_char, end_char)`` of the context, when the
        whole answer is in this window (None otherwise)."""
        inside = [(i, s) for i, s in enumerate(self.spans) if s is not None]
        if not inside or inside[0][1][0] > start_char or inside[-1][1][1] < end_char:
            return None
        first = next(i for i, (a, b) in inside if b > start_char)
        last = next(i for i, (a, b) in reversed(inside) if a < end_char)
        return first, last


def check_window(max_len: int, stride: int, positions: int) -> None:
    """Windows a model with ``positions`` positions can read, and that always move on: a
    stride below half a window. A BadInput naming the option otherwise."""
    if not 8 <= max_len <= positions:
        raise BadInput(f"--max-len {max_len} must be between 8 and the model's {positions} "
                       "positions")
    if not 0 <= stride < max_len // 2:
        raise BadInput(f"--stride {stride} must be at least 0 and below half of --max-len "
                       f"{max_len}")


def windows(tokenizer, question: str, context: str, max_len: int = 384,
            stride: int = 128) -> list[Window]:
    """``[CLS] question [SEP] part of context [SEP]`` windows: the question whole, the
    context cut so that consecutive windows share ``stride`` context tokens."""
    backend = tokenizer.backend
    backend.enable_truncation(max_len, stride=stride, strategy="only_second")
    try:
        first = backend.encode(question, context)
    except Exception as e:  # the tokenizers library's: a question that leaves no room
        raise BadInput(f"question {question[:40]!r}: windows of {max_len} tokens with stride "
                       f"{stride} cannot hold it and a part of the context ({e})") from None
    finally:
        backend.no_truncation()
    out = []
    for enc in [first, *first.overflowing]:
        spans = [span if seq == 1 else None
                 for span, seq in zip(enc.offsets, enc.sequence_ids, strict=True)]
        out.append(Window(enc.ids, enc.type_ids, spans))
    return out


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
