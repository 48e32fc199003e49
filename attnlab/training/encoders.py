"""Fine-tuning a pretrained encoder (BERT, MiniLM): a new head on its copied weights.

* :class:`ClassifyRecipe`: a [CLS] classifier on labelled JSON lines (``train classify``);
* :func:`token_encoder` and :func:`from_encoder`: the start that the classifier, named-entity
  (:mod:`attnlab.training.ner`) and question-answering (:mod:`attnlab.training.qa`) recipes
  share;
* :func:`finish_classifier`: a classifier's scores at the end (text or images).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from attnlab import build
from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.storage import Loaded
from attnlab.training.recipes import Prepared, Recipe, run, write_final
from attnlab.training.tasks import Classify
from attnlab.training.trainer import TrainConfig


@dataclass
class ClassifyRecipe(Recipe):
    """Labelled JSON lines with a fixed hash split (80/10/10), fine-tuning ``init``; early
    stopping on validation loss keeps the best model, saved in ``out_dir/final``. Results:
    accuracy and macro-F1 on the validation and test splits."""

    arch = "encoder"
    data: str | Path
    text_field: str
    label_field: str
    init: str
    max_len: int = 128
    batch_size: int = 32
    id_field: str = "id"

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
        from attnlab.data.classify import (
            ClassifyBatches,
            encode_examples,
            fixed_batches,
            read_labelled,
            split_by_hash,
        )
        from attnlab.storage import load

        examples = read_labelled(self.data, self.text_field, self.label_field, self.id_field)
        train, val, test = split_by_hash(examples)
        labels = sorted({e.label for e in examples})
        if len({e.label for e in train}) < 2:
            raise BadInput(f"{self.data}: the training split has fewer than 2 labels")
        base = load(self.init).expect("encoder", "train classify")
        tok = base.tokenizer
        max_len = min(self.max_len, base.max_len)
        config = dataclasses.replace(base.config, head="classify", num_labels=len(labels),
                                     extra={**base.config.extra, "labels": labels})
        build.check_training_memory(config, self.batch_size, max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        rows = {name: encode_examples(part, tok, labels, max_len)
                for name, part in (("train", train), ("val", val), ("test", test))}
        val_batches = fixed_batches(rows["val"], self.batch_size, tok.pad_id)
        return Prepared(config, {"text": tok},
                        ClassifyBatches(rows["train"], self.batch_size, tok.pad_id,
                                        train_config.seed),
                        Classify(),
                        f"{len(train)} train, {len(val)} validation, {len(test)} test "
                        f"examples; labels {labels}; inputs cut to {max_len} tokens",
                        val_batches=val_batches,
                        state={"base": base.model,
                               "test": fixed_batches(rows["test"], self.batch_size,
                                                     tok.pad_id)})

    def build(self, prepared: Prepared) -> nn.Module:
        return from_encoder(prepared.config, prepared.state.pop("base"), self.init)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        return finish_classifier(model, prepared, out_dir, rank)


def token_encoder(init: str, command: str, max_len: int) -> tuple[Loaded, int]:
    """The pretrained encoder that a token-level task (NER, QA) starts from, and
    the longest input it takes: ``max_len`` capped at the model's positions, not at a sentence
    encoder's shorter cap (MiniLM's 256). Its tokenizer must be WordPiece: predictions map
    back to words and characters through it."""
    from attnlab.storage import load

    base = load(init).expect("encoder", f"train {command}")
    if not hasattr(base.tokenizer, "backend"):
        raise BadInput(f"{init}: train {command} needs a WordPiece tokenizer (a BERT-family "
                       "model), not a character or word one")
    return base, min(max_len, base.config.max_len - base.config.position_offset)


def from_encoder(config: ModelConfig, base: nn.Module, init: str) -> nn.Module:
    """A model of ``config`` (an encoder with a new head) whose encoder (and pooler, when it
    has one) is copied from ``base``; the new head starts at N(0, 0.02)."""
    model = build_model(config)
    heads = ("mlm.", "nsp.", "classifier.", "qa.") + (() if model.pooler else ("pooler.",))
    state = {k: v for k, v in base.state_dict().items() if not k.startswith(heads)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(("pooler.", "classifier.", "qa.")) for k in missing):
        raise BadInput(f"{init}: encoder weights do not fit (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    return model


def finish_classifier(model: nn.Module, prepared: Prepared, out_dir: Path,
                      rank: int) -> dict[str, float]:
    """A classifier's end of training (text or images): the model the run ends with (the one
    early stopping kept, when it kept one) scored on the validation and test
    (``state["test"]``) batches, and written to ``final/``."""
    from attnlab.training.tasks import classification_metrics

    device, n = next(model.parameters()).device, model.config.num_labels
    results = {}
    for split, batches in (("val", prepared.val_batches), ("test", prepared.state["test"])):
        results.update({f"{split}_{k}": v for k, v in classification_metrics(
            model, batches, device, n, prepared.task).items()})
    write_final(model, prepared, out_dir, rank)
    return results


def train_classify(data: str | Path, text_field: str, label_field: str, init: str,
                   out_dir: str | Path, train_config: TrainConfig, max_len: int = 128,
                   batch_size: int = 32, id_field: str = "id", resume: bool = False,
                   log=print) -> dict[str, float]:
    """The validation and test splits' accuracy and macro-F1."""
    recipe = ClassifyRecipe(data, text_field, label_field, init, max_len, batch_size, id_field)
    return run(recipe, out_dir, None, train_config, resume, log).results


__all__ = ["ClassifyRecipe", "finish_classifier", "from_encoder", "token_encoder",
           "train_classify"]
