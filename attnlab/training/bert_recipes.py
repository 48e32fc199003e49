"""Encoder (BERT) jobs: masked-LM pretraining on a text file, fine-tuning a classifier.

Used by ``attnlab train mlm`` and ``attnlab train classify``; plain functions over the
library's parts, so the same steps work from Python.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from attnlab import hardware
from attnlab.config import ModelConfig
from attnlab.data.classify import (
    ClassifyBatches,
    encode_examples,
    fixed_batches,
    read_labelled,
    split_by_hash,
)
from attnlab.data.mlm import MLMBatches
from attnlab.models import BERT
from attnlab.tokenizers.wordpiece import WordPieceTokenizer
from attnlab.training import distributed
from attnlab.training.checkpoint import save_model_dir
from attnlab.training.recipes import _refuse_to_overwrite
from attnlab.training.tasks import Classify, MaskedLM, classification_metrics
from attnlab.training.trainer import TrainConfig, Trainer


def train_mlm(text_path: str | Path, out_dir: str | Path, model_config: ModelConfig,
              train_config: TrainConfig, max_len: int = 128, batch_size: int = 32,
              tokenizer: str | None = None, vocab_size: int = 8000, nsp: bool = False,
              val_fraction: float = 0.05, resume: bool = False, log=print):
    """Masked-LM (and optionally NSP) pretraining; each non-empty line is a sentence and
    consecutive lines are consecutive text. The last ``val_fraction`` of lines validate.

    ``tokenizer``: a ``vocab.txt`` / ``tokenizer.json`` / model folder; by default a WordPiece
    vocabulary of ``vocab_size`` is learned from the text. Returns ``(model, tokenizer,
    history)``.
    """
    rank, _ = distributed.init_from_env()
    _refuse_to_overwrite(out_dir, resume)
    path = Path(text_path)
    if not path.exists():
        raise FileNotFoundError(f"text file not found: {path}")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) < 20:
        raise ValueError(f"{path}: {len(lines)} non-empty lines; masked-LM needs at least 20")
    tok = (WordPieceTokenizer.from_file(tokenizer) if tokenizer
           else WordPieceTokenizer.train([str(path)], vocab_size=vocab_size))
    sentences = [tok.encode(line, add_special=False) for line in lines]
    split = min(int(len(sentences) * (1 - val_fraction)), len(sentences) - 2)
    config = dataclasses.replace(
        model_config, vocab_size=tok.vocab_size, head="pretraining" if nsp else "mlm",
        max_len=max(model_config.max_len, max_len), pad_id=tok.pad_id, unk_id=tok.unk_id,
        bos_id=tok.cls_id, eos_id=tok.sep_id)
    torch.manual_seed(train_config.seed)
    model = BERT(config).to(hardware.pick_device(train_config.device))
    val = MLMBatches(sentences[split:], tok, max_len, batch_size, seed=10_007, nsp=nsp)
    val_batches = [val.batch(i) for i in range(max(1, min(20, (len(lines) - split) // 4)))]
    if rank == 0:
        log(f"data: {split:,} training and {len(lines) - split:,} validation lines "
            f"(WordPiece vocabulary {tok.vocab_size})")
    trainer = Trainer(model, MLMBatches(sentences[:split], tok, max_len, batch_size,
                                        train_config.seed, nsp), train_config, out_dir,
                      {"text": tok.to_dict()}, config, task=MaskedLM(),
                      val_batches=val_batches)
    if resume and trainer.resume() and rank == 0:
        log(f"resumed from step {trainer.step}")
    history = trainer.fit()
    return model.eval(), tok, history


def classifier_from(init: str, labels: list[str]) -> tuple[BERT, WordPieceTokenizer, int]:
    """A ``head='classify'`` BERT whose encoder (and pooler, when it has one) are copied from
    ``init`` (``minilm``, a Hugging Face BERT folder or an attnlab run); the classifier starts
    at N(0, 0.02)."""
    from attnlab.encoding import load_encoder

    base = load_encoder(init)
    config = dataclasses.replace(base.model.config, head="classify", num_labels=len(labels),
                                 extra={**base.model.config.extra, "labels": labels})
    model = BERT(config)
    state = {k: v for k, v in base.model.state_dict().items()
             if not k.startswith(("mlm.", "nsp.", "classifier."))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(("pooler.", "classifier.")) for k in missing):
        raise ValueError(f"{init}: encoder weights do not fit (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return model, base.tokenizer, base.max_len


def train_classify(data: str | Path, text_field: str, label_field: str, init: str,
                   out_dir: str | Path, train_config: TrainConfig, max_len: int = 128,
                   batch_size: int = 32, id_field: str = "id", resume: bool = False,
                   log=print) -> dict[str, float]:
    """Fine-tune ``init`` on labelled JSON lines with a fixed hash split (80/10/10); early
    stopping on validation loss keeps the best model in ``out_dir/final``. Returns the test
    split's accuracy and macro-F1 (and the validation ones)."""
    rank, _ = distributed.init_from_env()
    _refuse_to_overwrite(out_dir, resume)
    examples = read_labelled(data, text_field, label_field, id_field)
    train, val, test = split_by_hash(examples)
    labels = sorted({e.label for e in examples})
    if len({e.label for e in train}) < 2:
        raise ValueError(f"{data}: the training split has fewer than 2 labels")
    model, tok, model_max = classifier_from(init, labels)
    max_len = min(max_len, model_max)
    device = hardware.pick_device(train_config.device)
    model = model.to(device)
    rows = {name: encode_examples(part, tok, labels, max_len)
            for name, part in (("train", train), ("val", val), ("test", test))}
    if rank == 0:
        log(f"data: {len(train)} train, {len(val)} validation, {len(test)} test examples; "
            f"labels {labels}; inputs cut to {max_len} tokens")
    val_batches = fixed_batches(rows["val"], batch_size, tok.pad_id)
    trainer = Trainer(model, ClassifyBatches(rows["train"], batch_size, tok.pad_id,
                                             train_config.seed), train_config, out_dir,
                      {"text": tok.to_dict()}, model.config, task=Classify(),
                      val_batches=val_batches)
    if resume and trainer.resume() and rank == 0:
        log(f"resumed from step {trainer.step}")
    trainer.fit()
    best = Path(out_dir) / "best"
    if best.exists():
        from attnlab.training.checkpoint import load_weights

        load_weights(model, best)
    results = {f"val_{k}": v for k, v in classification_metrics(
        model, val_batches, device, len(labels)).items()}
    results.update({f"test_{k}": v for k, v in classification_metrics(
        model, fixed_batches(rows["test"], batch_size, tok.pad_id), device,
        len(labels)).items()})
    if rank == 0:
        save_model_dir(Path(out_dir) / "final", model, model.config, {"text": tok.to_dict()})
    return results
