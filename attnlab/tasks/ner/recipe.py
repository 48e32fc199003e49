"""``train ner``: a pretrained encoder fine-tuned to tag words with BIO tags from CoNLL files
(:mod:`attnlab.tasks.ner.data`), as transformers' ``run_ner.py`` does it: a linear ``tokens``
head on the encoder's last layer, trained on each word's first subword, no CRF. Validation
loss drives early stopping; after training the kept model is scored at the entity level
(precision, recall, F1: :func:`attnlab.tasks.ner.predict.entity_scores`) on the development
and test files, whose tags are predicted word by word.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from attnlab import build
from attnlab.config import ModelConfig
from attnlab.data.labelled import LabelledBatches, fixed_batches
from attnlab.errors import BadInput
from attnlab.tasks.ner.data import conll_files, encode_sentences, read_conll, tag_set
from attnlab.tasks.ner.predict import score
from attnlab.tasks.pretrained import from_encoder, token_encoder
from attnlab.training.objectives import Tag
from attnlab.training.recipes import Prepared, Recipe, write_final
from attnlab.training.train_config import TrainConfig


@dataclass
class NERRecipe(Recipe):
    """CoNLL ``train.txt`` (and ``dev.txt`` for validation, ``test.txt`` for the last
    score), fine-tuning the encoder ``init``. Results: entity P/R/F1 on dev and test."""

    arch = "encoder"
    data: str | Path
    init: str
    max_len: int = 128
    batch_size: int = 32

    def prepare(self, model_config: ModelConfig | None,
                train_config: TrainConfig) -> Prepared:
        files = conll_files(self.data)
        parts = {split: read_conll(path) for split, path in files.items()}
        tags = tag_set(parts["train"])
        base, max_len = token_encoder(self.init, "ner", self.max_len)
        tok = base.tokenizer
        config = dataclasses.replace(base.config, head="tokens", num_labels=len(tags),
                                     extra={**base.config.extra, "labels": tags})
        build.check_training_memory(config, self.batch_size, max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        rows = {}
        for split, sentences in parts.items():
            try:
                rows[split] = encode_sentences(sentences, tok, tags, max_len)
            except BadInput as e:
                raise BadInput(f"{files[split]}: {e}") from None
        val = fixed_batches(rows["dev"], self.batch_size, tok.pad_id) if "dev" in rows else None
        words = {split: sum(len(s.words) for s in part) for split, part in parts.items()}
        summary = (", ".join(f"{split} {len(parts[split]):,} sentences ({words[split]:,} words)"
                             for split in parts)
                   + f"; tags {tags}; inputs cut to {max_len} tokens")
        return Prepared(config, {"text": tok},
                        LabelledBatches(rows["train"], self.batch_size, tok.pad_id,
                                        train_config.seed),
                        Tag(), summary, val_batches=val,
                        state={"base": base.model, "sentences": parts, "max_len": max_len})

    def build(self, prepared: Prepared) -> nn.Module:
        return from_encoder(prepared.config, prepared.state.pop("base"), self.init)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        """The model the run ends with (the one early stopping kept, when it kept one) scored
        on dev and test, then written to ``final/``."""
        model.eval()
        results = {}
        tok = prepared.tokenizers["text"]
        for split in ("dev", "test"):
            sentences = prepared.state["sentences"].get(split)
            if sentences:
                scores = score(model, tok, sentences, max_len=prepared.state["max_len"])
                results.update({f"{split}_precision": scores.precision,
                                f"{split}_recall": scores.recall, f"{split}_f1": scores.f1})
        write_final(model, prepared, out_dir, rank)
        return results
