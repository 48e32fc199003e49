"""SQuAD files and the windows a model reads.

SQuAD files (Rajpurkar et al., 2016): JSON, optionally gzipped, ``{"data": [article, ...]}``
with each article ``{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}]}]}]}``. The file is untrusted: every field is checked,
and a wrong one is one error naming the file and the question or article.

A context longer than the model's window is read in windows of ``max_len`` tokens whose
context parts overlap by ``stride`` tokens, as transformers' tokenizers cut them
(``truncation="only_second", return_overflowing_tokens=True, stride=...``).

Training features follow transformers' ``run_qa.py`` for SQuAD v1: each window of a
question (:func:`windows`) is one training row whose target is the first answer's first and
last token when the whole answer is in the window, else [CLS] (position 0) for both.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.labelled import LabelledBatches, padded
from attnlab.data.stream import LabelledBatch
from attnlab.errors import BadInput, MissingFile

MAX_BYTES = 1 << 30  # a SQuAD file larger than this (decompressed) is refused


@dataclass(frozen=True)
class Question:
    id: str
    article: int  # the article's index in the file
    question: str
    context: str
    answers: tuple[str, ...]
    starts: tuple[int, ...]  # each answer's first character in the context


def read_squad(path: str | os.PathLike, articles: range | None = None) -> list[Question]:
    """The questions of a SQuAD file, of the articles whose index is in ``articles`` (all
    when None)."""
    path = Path(path)
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise MissingFile(f"SQuAD file not found: {path}") from None
    except (OSError, EOFError) as e:
        raise BadInput(f"{path}: not readable ({e})") from None
    if len(raw) > MAX_BYTES:
        raise BadInput(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))["data"]
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        raise BadInput(f"{path}: not a SQuAD JSON file ({e})") from None
    except (KeyError, TypeError):
        raise BadInput(f"{path}: no top-level \"data\" list (not a SQuAD file)") from None
    if not isinstance(data, list):
        raise BadInput(f"{path}: \"data\" is not a list of articles")
    out = []
    for a, article in enumerate(data):
        if articles is not None and a not in articles:
            continue
        try:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    out.append(_question(qa, a, context))
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"{path}: article {a}: missing or malformed field {e}") from None
    if not out:
        raise BadInput(f"{path}: no questions in articles {articles}")
    return out


def _question(qa: dict, article: int, context: str) -> Question:
    texts = tuple(str(x["text"]) for x in qa["answers"])
    starts = tuple(int(x["answer_start"]) for x in qa["answers"])
    if not isinstance(context, str) or not isinstance(qa["question"], str) or not texts:
        raise ValueError(f"question {qa.get('id')!r}: a context, question and answers")
    for text, start in zip(texts, starts, strict=True):
        if not text.strip():
            raise ValueError(f"question {qa['id']!r}: an empty answer")
        if start < 0 or context[start : start + len(text)] != text:
            raise ValueError(f"question {qa['id']!r}: answer {text!r} is not at character "
                             f"{start} of its context")
    return Question(str(qa["id"]), article, qa["question"], context, texts, starts)


# --- windows ---------------------------------------------------------------------------------
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


# --- training rows ---------------------------------------------------------------------------
def training_rows(questions: list[Question], tokenizer, max_len: int,
                  stride: int) -> list[tuple[list[int], list[int], int, int]]:
    """``(ids, token_types, start, end)`` for every window of every question."""
    rows = []
    for q in questions:
        first, last = q.starts[0], q.starts[0] + len(q.answers[0])
        for w in windows(tokenizer, q.question, q.context, max_len, stride):
            where = w.position_of(first, last)
            rows.append((w.ids, w.types, *(where if where is not None else (0, 0))))
    return rows


def collate_spans(rows: list[tuple[list[int], list[int], int, int]], pad_id: int) -> LabelledBatch:
    """``(ids, token_type_ids, attention_mask, labels (batch, 2))``, right-padded."""
    ids, mask = padded([r[0] for r in rows], pad_id)
    types, _ = padded([r[1] for r in rows], 0)
    return LabelledBatch(ids, types, mask, torch.tensor([[r[2], r[3]] for r in rows]))


def fixed_span_batches(rows, batch_size: int, pad_id: int) -> list[LabelledBatch]:
    """Validation batches in a fixed order, by length."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    return [collate_spans([rows[i] for i in order[s : s + batch_size]], pad_id)
            for s in range(0, len(order), batch_size)]


class SpanBatches(LabelledBatches):
    """Endless shuffled training batches of windows, as :class:`LabelledBatches` draws them."""

    @staticmethod
    def collate(rows: list, pad_id: int) -> LabelledBatch:
        return collate_spans(rows, pad_id)
