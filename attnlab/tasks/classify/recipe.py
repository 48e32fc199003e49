"""``train classify``: a [CLS] classifier fine-tuned from a pretrained encoder (BERT, MiniLM)
on labelled JSON lines (:mod:`attnlab.tasks.classify.data`): texts, pairs of texts
(``pair_field``), or long documents read in windows whose logits are pooled (``pool``,
:mod:`attnlab.tasks.classify.windows`); early stopping on the validation loss; accuracy and
macro-F1 on the validation and test splits at the end, and the test split's full report
(:mod:`attnlab.tasks.classify.scores`), printed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnlab import build
from attnlab.config import ModelConfig
from attnlab.data.labelled import LabelledBatches, fixed_batches
from attnlab.errors import BadInput
from attnlab.storage import load
from attnlab.tasks.classify.data import (
    TRUNCATIONS,
    PairBatches,
    encode_examples,
    encode_pairs,
    fixed_pair_batches,
    read_labelled,
    split_by_hash,
)
from attnlab.tasks.classify.predict import batch_logits, decisions
from attnlab.tasks.classify.scores import classification_report, format_report
from attnlab.tasks.classify.windows import (
    POOLS,
    WindowStream,
    check_windows,
    default_stride,
    encode_windows,
    fixed_window_batches,
)
from attnlab.tasks.pretrained import from_encoder
from attnlab.training.objectives import Classify
from attnlab.training.recipes import Prepared, Recipe, finish_classifier, run
from attnlab.training.train_config import TrainConfig


class PooledClassify(Classify):
    """Cross-entropy of one label per document, on its windows' pooled logits."""

    def __init__(self, pool: str):
        super().__init__()
        self.pool = pool

    def logits(self, model: nn.Module, batch) -> torch.Tensor:
        """``(documents, num_labels)``."""
        return batch_logits(model, batch, self.pool)


@dataclass
class ClassifyRecipe(Recipe):
    """Labelled JSON lines with a fixed hash split (80/10/10), fine-tuning ``init``; early
    stopping on validation loss keeps the best model, saved in ``out_dir/final``. Results:
    accuracy and macro-F1 on the validation and test splits; the test split's report goes to
    ``log``. ``pair_field``: pairs cut ``truncation``; ``pool``: windows of ``max_len`` tokens
    sharing ``stride`` (default :func:`~attnlab.tasks.classify.windows.default_stride`)."""

    arch = "encoder"
    data: str | Path
    text_field: str
    label_field: str
    init: str
    max_len: int = 128
    batch_size: int = 32
    id_field: str = "id"
    log: Callable[[str], object] = print
    pair_field: str | None = None
    truncation: str = "longest_first"
    pool: str | None = None
    stride: int | None = None

    def _check_options(self) -> None:
        if self.truncation not in TRUNCATIONS:
            raise BadInput(f"truncation {self.truncation!r} is not one of "
                           f"{', '.join(TRUNCATIONS)}")
        if self.pool is not None and self.pool not in POOLS:
            raise BadInput(f"pool {self.pool!r} is not one of {', '.join(POOLS)}")
        if self.pool and self.pair_field:
            raise BadInput("--pool reads long single texts in windows; it does not take "
                           "--pair-field")
        if self.stride is not None and not self.pool:
            raise BadInput("--stride is the overlap of windows: it needs --pool")

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
        self._check_options()
        examples = read_labelled(self.data, self.text_field, self.label_field, self.id_field,
                                 self.pair_field)
        train, val, test = split_by_hash(examples)
        labels = sorted({e.label for e in examples})
        if len({e.label for e in train}) < 2:
            raise BadInput(f"{self.data}: the training split has fewer than 2 labels")
        base = load(self.init).expect("encoder", "train classify")
        tok = base.tokenizer
        max_len = min(self.max_len, base.max_len)
        extra = {**base.config.extra, "labels": labels}
        stride = default_stride(max_len) if self.stride is None else self.stride
        if self.pair_field:  # how it reads, for classify and evaluate classify to read alike
            extra["reading"] = {"pair_field": self.pair_field, "truncation": self.truncation}
        elif self.pool:
            if base.config.reads_long_documents:
                raise BadInput("--pool reads a long text in windows; this Longformer model "
                               "reads the whole document (its attention_window): leave --pool "
                               "out")
            check_windows(max_len, stride)
            extra["reading"] = {"pool": self.pool, "max_len": max_len, "stride": stride}
        # an encoder pretrained without a pooler (ELECTRA's discriminator) gets a new one,
        # initialised as a head is: the [CLS] classifier reads it
        config = dataclasses.replace(base.config, head="classify", num_labels=len(labels),
                                     pooler=True, extra=extra)
        build.check_training_memory(config, self.batch_size, max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        parts = (("train", train), ("val", val), ("test", test))
        task: Classify = Classify()
        if self.pair_field:
            rows = {name: encode_pairs(part, tok, labels, max_len, self.truncation)
                    for name, part in parts}
            stream, fixed = PairBatches, fixed_pair_batches
            inputs = f"pairs cut {self.truncation} to {max_len} tokens"
        elif self.pool:
            rows = {name: encode_windows(part, tok, labels, max_len, stride)
                    for name, part in parts}
            stream, fixed = WindowStream, fixed_window_batches
            task = PooledClassify(self.pool)
            windows = sum(len(w) for w, _ in rows["train"])
            inputs = (f"read in windows of {max_len} tokens sharing {stride} ({windows} "
                      f"training windows), their logits pooled by {self.pool}")
        else:
            rows = {name: encode_examples(part, tok, labels, max_len) for name, part in parts}
            stream, fixed = LabelledBatches, fixed_batches
            inputs = f"inputs cut to {max_len} tokens"
        return Prepared(config, {"text": tok},
                        stream(rows["train"], self.batch_size, tok.pad_id, train_config.seed),
                        task,
                        f"{len(train)} train, {len(val)} validation, {len(test)} test "
                        f"examples; labels {labels}; {inputs}",
                        val_batches=fixed(rows["val"], self.batch_size, tok.pad_id),
                        state={"base": base.model,
                               "test": fixed(rows["test"], self.batch_size, tok.pad_id)})

    def build(self, prepared: Prepared) -> nn.Module:
        return from_encoder(prepared.config, prepared.state.pop("base"), self.init)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        results = finish_classifier(model, prepared, out_dir, rank)
        if rank == 0 and prepared.state["test"]:
            labels = prepared.config.extra["labels"]
            report = classification_report(*decisions(model, prepared.state["test"], self.pool),
                                           labels)
            self.log(f"test split, {report.total:,} examples:")
            # a matrix of more than 10 classes is wider than a terminal: evaluate classify
            for line in format_report(report, confusion=len(labels) <= 10):
                self.log(line)
        return results


def train_classify(data: str | Path, text_field: str, label_field: str, init: str,
                   out_dir: str | Path, train_config: TrainConfig, max_len: int = 128,
                   batch_size: int = 32, id_field: str = "id", resume: bool = False,
                   log=print, pair_field: str | None = None, truncation: str = "longest_first",
                   pool: str | None = None, stride: int | None = None) -> dict[str, float]:
    """The validation and test splits' accuracy and macro-F1 (the test split's report goes
    to ``log``)."""
    recipe = ClassifyRecipe(data, text_field, label_field, init, max_len, batch_size, id_field,
                            log, pair_field, truncation, pool, stride)
    return run(recipe, out_dir, None, train_config, resume, log).results


__all__ = ["ClassifyRecipe", "PooledClassify", "train_classify"]
