"""``train classify``: a [CLS] classifier fine-tuned from a pretrained encoder (BERT, MiniLM)
on labelled JSON lines (:mod:`attnlab.tasks.classify.data`), with early stopping on the
validation loss; accuracy and macro-F1 on the validation and test splits at the end, and the
test split's full report (:mod:`attnlab.tasks.classify.scores`), printed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from attnlab import build
from attnlab.config import ModelConfig
from attnlab.data.labelled import LabelledBatches, fixed_batches
from attnlab.errors import BadInput
from attnlab.storage import load
from attnlab.tasks.classify.data import encode_examples, read_labelled, split_by_hash
from attnlab.tasks.classify.predict import decisions
from attnlab.tasks.classify.scores import classification_report, format_report
from attnlab.tasks.pretrained import from_encoder
from attnlab.training.objectives import Classify
from attnlab.training.recipes import Prepared, Recipe, finish_classifier, run
from attnlab.training.train_config import TrainConfig


@dataclass
class ClassifyRecipe(Recipe):
    """Labelled JSON lines with a fixed hash split (80/10/10), fine-tuning ``init``; early
    stopping on validation loss keeps the best model, saved in ``out_dir/final``. Results:
    accuracy and macro-F1 on the validation and test splits; the test split's report goes to
    ``log``."""

    arch = "encoder"
    data: str | Path
    text_field: str
    label_field: str
    init: str
    max_len: int = 128
    batch_size: int = 32
    id_field: str = "id"
    log: Callable[[str], object] = print

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
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
                        LabelledBatches(rows["train"], self.batch_size, tok.pad_id,
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
        results = finish_classifier(model, prepared, out_dir, rank)
        if rank == 0 and prepared.state["test"]:
            labels = prepared.config.extra["labels"]
            report = classification_report(*decisions(model, prepared.state["test"]), labels)
            self.log(f"test split, {report.total:,} examples:")
            # a matrix of more than 10 classes is wider than a terminal: evaluate classify
            for line in format_report(report, confusion=len(labels) <= 10):
                self.log(line)
        return results


def train_classify(data: str | Path, text_field: str, label_field: str, init: str,
                   out_dir: str | Path, train_config: TrainConfig, max_len: int = 128,
                   batch_size: int = 32, id_field: str = "id", resume: bool = False,
                   log=print) -> dict[str, float]:
    """The validation and test splits' accuracy and macro-F1 (the test split's report goes
    to ``log``)."""
    recipe = ClassifyRecipe(data, text_field, label_field, init, max_len, batch_size, id_field,
                            log)
    return run(recipe, out_dir, None, train_config, resume, log).results


__all__ = ["ClassifyRecipe", "train_classify"]
