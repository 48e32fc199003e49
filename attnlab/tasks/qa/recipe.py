"""``train qa``: a pretrained encoder fine-tuned on SQuAD-format data with a span head
(:mod:`attnlab.tasks.qa`), as transformers' ``run_qa.py`` does it: windows of ``max_len``
tokens overlapping by ``stride``, the answer's first and last token as targets (the [CLS]
position when the answer is not in the window). Training and evaluation questions come
from two ranges of articles of one file, so that no article is on both sides (SQuAD's
training set is not needed: ``dev-v1.1.json`` articles 0-37 train, 38-47 evaluate). After
training the kept model answers every evaluation question; results are SQuAD's exact match
and F1 (:func:`attnlab.tasks.qa.predict.score_questions`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from attnlab import build
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.tasks.pretrained import from_encoder, token_encoder
from attnlab.tasks.qa.data import (
    SpanBatches,
    check_window,
    fixed_span_batches,
    read_squad,
    training_rows,
)
from attnlab.tasks.qa.predict import score_questions
from attnlab.training.objectives import Span
from attnlab.training.recipes import Prepared, Recipe, write_final
from attnlab.training.train_config import TrainConfig


def article_range(text: str) -> range:
    """``"0-37"`` -> ``range(0, 38)`` (both ends included); ``"5"`` -> ``range(5, 6)``."""
    try:
        first, _, last = text.partition("-")
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise BadInput(f"article range {text!r}: expected FIRST-LAST, e.g. 0-37") from None
    if lo < 0 or hi < lo:
        raise BadInput(f"article range {text!r}: expected 0 <= FIRST <= LAST")
    return range(lo, hi + 1)


@dataclass
class QARecipe(Recipe):
    """SQuAD questions of ``train_articles`` to train on, of ``eval_articles`` to validate and
    score; ``init`` the encoder to start from. Results: ``exact_match`` and ``f1``."""

    arch = "encoder"
    data: str | Path
    init: str
    train_articles: range
    eval_articles: range
    max_len: int = 384
    stride: int = 128
    batch_size: int = 16
    max_answer_len: int = 30

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
        if set(self.train_articles) & set(self.eval_articles):
            raise BadInput("the training and evaluation article ranges overlap")
        train = read_squad(self.data, self.train_articles)
        held_out = read_squad(self.data, self.eval_articles)
        base, max_len = token_encoder(self.init, "qa", self.max_len)
        tok = base.tokenizer
        check_window(max_len, self.stride, max_len)
        window = {"max_len": max_len, "stride": self.stride}  # what `attnlab qa` reads with
        config = dataclasses.replace(base.config, head="qa", num_labels=2,
                                     extra={**base.config.extra, "qa_window": window})
        build.check_training_memory(config, self.batch_size, max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        rows = training_rows(train, tok, max_len, self.stride)
        val_rows = training_rows(held_out, tok, max_len, self.stride)
        summary = (f"{len(train):,} training questions ({len(rows):,} windows) from articles "
                   f"{self.train_articles.start}-{self.train_articles.stop - 1}, "
                   f"{len(held_out):,} evaluation questions from articles "
                   f"{self.eval_articles.start}-{self.eval_articles.stop - 1}; windows of "
                   f"{max_len} tokens, stride {self.stride}")
        return Prepared(config, {"text": tok},
                        SpanBatches(rows, self.batch_size, tok.pad_id, train_config.seed),
                        Span(), summary,
                        val_batches=fixed_span_batches(val_rows, self.batch_size, tok.pad_id),
                        state={"base": base.model, "eval": held_out, "max_len": max_len})

    def build(self, prepared: Prepared) -> nn.Module:
        return from_encoder(prepared.config, prepared.state.pop("base"), self.init)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        """The model the run ends with (the one early stopping kept, when it kept one) answers
        every evaluation question; SQuAD's EM and F1; the model is written to ``final/``."""
        questions = prepared.state["eval"]
        em, f1, _ = score_questions(model, prepared.tokenizers["text"], questions,
                                    prepared.state["max_len"], self.stride, self.max_answer_len)
        write_final(model, prepared, out_dir, rank)
        return {"exact_match": em, "f1": f1, "questions": len(questions)}
