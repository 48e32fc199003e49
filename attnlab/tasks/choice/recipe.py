"""``train choice``: a pretrained encoder fine-tuned with a multiple-choice head
(:mod:`attnlab.tasks.choice.head`) on the JSON lines ``evaluate choice`` reads: the
cross-entropy of the right choice under the softmax of the question's choice logits, as
transformers' ``BertForMultipleChoice`` trains. Early stopping on ``valid``'s loss when a
validation file is given. Results: the accuracy on ``valid``, else on the training questions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnlab import build
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.tasks.choice.data import read_examples
from attnlab.tasks.choice.head import (
    QuestionBatches,
    choice_logits,
    decisions,
    fixed_question_batches,
    question_rows,
    score_questions,
)
from attnlab.tasks.pretrained import from_encoder, token_encoder
from attnlab.tokenizers.wordpiece import PAIR_TRUNCATIONS
from attnlab.training.objectives import Classify
from attnlab.training.recipes import Prepared, Recipe, run, write_final
from attnlab.training.train_config import TrainConfig


class Choose(Classify):
    """Cross-entropy of the right choice, over the choices a question has."""

    def logits(self, model: nn.Module, batch) -> torch.Tensor:
        """``(questions, choices)``."""
        return choice_logits(model, batch)


@dataclass
class ChoiceRecipe(Recipe):
    """Questions of ``data`` to train on (and of ``valid`` to validate on), fine-tuning
    ``init``; pairs cut to ``max_len`` tokens ``truncation``; the model in
    ``out_dir/final``."""

    arch = "encoder"
    data: str | Path
    init: str
    valid: str | Path | None = None
    max_len: int = 128
    batch_size: int = 16
    truncation: str = "longest_first"

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
        if self.truncation not in PAIR_TRUNCATIONS:
            raise BadInput(f"truncation {self.truncation!r} is not one of "
                           f"{', '.join(PAIR_TRUNCATIONS)}")
        train = read_examples(self.data)
        held_out = read_examples(self.valid) if self.valid else []
        base, max_len = token_encoder(self.init, "choice", self.max_len)
        tok = base.tokenizer
        most = max(len(e.choices) for e in [*train, *held_out])
        # num_labels: the most choices a question had; the head itself scores any number
        reading = {"max_len": max_len, "truncation": self.truncation}
        config = dataclasses.replace(base.config, head="choice", num_labels=most, pooler=True,
                                     extra={**base.config.extra, "reading": reading})
        build.check_training_memory(config, self.batch_size * most, max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size} "
                                    f"({most} choices a question)",
                                    train_config.device_for_memory)
        rows = question_rows(train, tok, max_len, self.truncation)
        val_rows = question_rows(held_out, tok, max_len, self.truncation)
        summary = (f"{len(train):,} training questions"
                   + (f", {len(held_out):,} validation questions" if held_out else "")
                   + f"; up to {most} choices, each read with its context, cut "
                     f"{self.truncation} to {max_len} tokens")
        return Prepared(config, {"text": tok},
                        QuestionBatches(rows, self.batch_size, tok.pad_id, train_config.seed),
                        Choose(), summary,
                        val_batches=(fixed_question_batches(val_rows, self.batch_size,
                                                            tok.pad_id) if held_out else None),
                        state={"base": base.model, "scored": held_out or train,
                               "max_len": max_len})

    def build(self, prepared: Prepared) -> nn.Module:
        return from_encoder(prepared.config, prepared.state.pop("base"), self.init)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        """The model the run ends with (the one early stopping kept, when it kept one)
        answers the validation questions (the training ones without); its accuracy; the
        model is written to ``final/``."""
        questions = prepared.state["scored"]
        scores = score_questions(model, prepared.tokenizers["text"], questions,
                                 prepared.state["max_len"], self.truncation, self.batch_size)
        right = sum(p == e.answer for p, e in zip(decisions(scores), questions, strict=True))
        write_final(model, prepared, out_dir, rank)
        split = "val" if self.valid else "train"
        return {f"{split}_accuracy": right / len(questions), "questions": len(questions)}


def train_choice(data: str | Path, init: str, out_dir: str | Path, train_config: TrainConfig,
                 valid: str | Path | None = None, max_len: int = 128, batch_size: int = 16,
                 truncation: str = "longest_first", resume: bool = False,
                 log=print) -> dict[str, float]:
    """``{"val_accuracy" or "train_accuracy", "questions"}``: the kept model's accuracy."""
    recipe = ChoiceRecipe(data, init, valid, max_len, batch_size, truncation)
    return run(recipe, out_dir, None, train_config, resume, log).results


__all__ = ["ChoiceRecipe", "Choose", "train_choice"]
