"""Training objectives: what one batch means to the trainer, how many tokens it predicts and
its loss.

The training loop (:mod:`attnlab.training.trainer`) is the same for every family; an objective
says how a batch is fed to the model:

* :class:`Seq2Seq` — a :class:`TranslationBatch`: ``model(src, tgt[:, :-1])`` predicts
  ``tgt[:, 1:]``;
* :class:`CausalLM` — an :class:`LMBatch`: ``model(inputs)`` predicts ``targets`` (the inputs
  shifted by one);
* :class:`MaskedLM` — a :class:`MaskedLMBatch`: BERT predicts the selected positions
  (``labels != -100``), plus next-sentence prediction when the model has that head;
* :class:`Classify` — a :class:`LabelledBatch`: one label per sequence;
* :class:`Tag` — a :class:`LabelledBatch`: one label per position (NER);
* :class:`Span` — a :class:`LabelledBatch`: an answer's first and last token (extractive QA);
* :class:`ImageClassify` — an :class:`ImageBatch`: one label per image (the ViT).

The two classifying objectives also give their ``logits(model, batch)``: the trainer reports (and
may stop on) their validation accuracy, and :func:`classification_metrics` scores them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab import hardware
from attnlab.data.stream import (
    ImageBatch,
    LabelledBatch,
    LMBatch,
    MaskedLMBatch,
    TranslationBatch,
    to_device,
)
from attnlab.training.loss import LossSums, label_smoothed_loss


class Seq2Seq:
    def __init__(self, pad_id: int, label_smoothing: float):
        self.pad_id, self.epsilon = pad_id, label_smoothing

    def target_tokens(self, batch: TranslationBatch) -> int:
        return int((batch.tgt[:, 1:] != self.pad_id).sum())

    def source_tokens(self, batch: TranslationBatch) -> int:
        return int((batch.src != self.pad_id).sum())

    def loss(self, model: nn.Module, batch: TranslationBatch) -> LossSums:
        logits = model(batch.src, batch.tgt[:, :-1])
        return label_smoothed_loss(logits, batch.tgt[:, 1:], self.epsilon, self.pad_id)


class CausalLM:
    def __init__(self, label_smoothing: float = 0.0):
        self.epsilon = label_smoothing

    def target_tokens(self, batch: LMBatch) -> int:
        return batch.targets.numel()

    def source_tokens(self, batch: LMBatch) -> int:
        return 0

    def loss(self, model: nn.Module, batch: LMBatch) -> LossSums:
        return label_smoothed_loss(model(batch.inputs), batch.targets, self.epsilon, pad_id=None)


class _EncoderInputs:
    """An encoder batch's input tokens are the real ones of its attention mask."""

    def source_tokens(self, batch: MaskedLMBatch | LabelledBatch) -> int:
        return int(batch.attention_mask.sum())


class MaskedLM(_EncoderInputs):
    """Loss = mean NLL over selected positions (+ mean NSP cross-entropy when present)."""

    def target_tokens(self, batch: MaskedLMBatch) -> int:
        return int((batch.labels != -100).sum())

    def loss(self, model: nn.Module, batch: MaskedLMBatch) -> LossSums:
        selected = batch.labels != -100
        out = model(batch.ids, batch.token_type_ids, batch.attention_mask,
                    masked_positions=selected)
        logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
        sums = label_smoothed_loss(logits, batch.labels[selected], 0.0, pad_id=None)
        if nsp_logits is not None:  # scaled so that, per selected token, it adds its mean
            sums.loss = sums.loss + F.cross_entropy(nsp_logits.float(), batch.nsp) * sums.tokens
        return sums


class Classify(_EncoderInputs):
    """Cross-entropy of one label per sequence (optionally label-smoothed)."""

    def __init__(self, label_smoothing: float = 0.0):
        self.epsilon = label_smoothing

    def target_tokens(self, batch: LabelledBatch | ImageBatch) -> int:
        return batch.labels.numel()

    def logits(self, model: nn.Module, batch: LabelledBatch) -> torch.Tensor:
        """``(batch, num_labels)``."""
        return model(batch.ids, batch.token_type_ids, batch.attention_mask)

    def loss(self, model: nn.Module, batch: LabelledBatch | ImageBatch) -> LossSums:
        return label_smoothed_loss(self.logits(model, batch), batch.labels, self.epsilon, None)


class Tag(_EncoderInputs):
    """Cross-entropy of one label per position (NER): logits ``(batch, seq, num_labels)``,
    labels ``(batch, seq)`` with -100 at the positions the loss skips (a word's later
    subwords, [CLS], [SEP], padding). Validation reports its loss; the entity F1 is scored
    on words after training (:mod:`attnlab.tasks.ner`)."""

    def target_tokens(self, batch: LabelledBatch) -> int:
        return int((batch.labels != -100).sum())

    def loss(self, model: nn.Module, batch: LabelledBatch) -> LossSums:
        logits = model(batch.ids, batch.token_type_ids, batch.attention_mask)
        return label_smoothed_loss(logits, batch.labels, 0.0, pad_id=-100)


class Span(_EncoderInputs):
    """Extractive QA: the cross-entropy of the answer's first token under the start logits
    and of its last under the end logits, halved (``(L_start + L_end) / 2`` per window, as
    BERT trains). Labels ``(batch, 2)``.

    Each softmax runs over the window's real tokens only: an answer is never padding.
    transformers' ``BertForQuestionAnswering`` lets padded positions into it, so its loss
    depends on how long the batch's longest window is; and where nothing is computed for
    padding while training (:mod:`attnlab.nn.packing`), a padded position's logit would be
    the head's bias alone, a score the model could not push below a real token's."""

    def target_tokens(self, batch: LabelledBatch) -> int:
        return batch.labels.shape[0]

    def loss(self, model: nn.Module, batch: LabelledBatch) -> LossSums:
        start, end = model(batch.ids, batch.token_type_ids, batch.attention_mask)
        if batch.attention_mask is not None:
            pad = ~batch.attention_mask.bool()
            start, end = (t.float().masked_fill(pad, float("-inf")) for t in (start, end))
        a = label_smoothed_loss(start[:, None], batch.labels[:, :1], 0.0, None)
        b = label_smoothed_loss(end[:, None], batch.labels[:, 1:], 0.0, None)
        return LossSums((a.loss + b.loss) / 2, (a.nll + b.nll) / 2, a.tokens)


class ImageClassify(Classify):
    """The same loss, one label per image: ``model(images)``; no input tokens are counted."""

    def source_tokens(self, batch: ImageBatch) -> int:
        return 0

    def logits(self, model: nn.Module, batch: ImageBatch) -> torch.Tensor:
        return model(batch.images)


@torch.no_grad()
def classification_metrics(model: nn.Module, batches, device: torch.device, num_labels: int,
                           task: Classify | None = None) -> dict[str, float]:
    """Accuracy and macro-F1 (the unweighted mean over classes of 2·P·R / (P + R)) of
    ``task``'s predictions (by default :class:`Classify`'s, of text)."""
    task = task or Classify()
    was_training = model.training
    model.eval()
    confusion = torch.zeros(num_labels, num_labels, dtype=torch.long)  # [true, predicted]
    for b in batches:
        b = to_device(b, device)
        pred = task.logits(model, b).argmax(-1).cpu()
        confusion += torch.bincount(b.labels.cpu() * num_labels + pred,
                                    minlength=num_labels**2).view(num_labels, num_labels)
    model.train(was_training)
    tp = confusion.diag().double()
    precision = tp / confusion.sum(0).clamp(min=1)
    recall = tp / confusion.sum(1).clamp(min=1)
    f1 = torch.where(tp > 0, 2 * precision * recall / (precision + recall), torch.zeros_like(tp))
    return {"accuracy": float(tp.sum() / confusion.sum().clamp(min=1)),
            "macro_f1": float(f1.mean())}


@torch.no_grad()
def evaluate(model: nn.Module, task, batches, device: torch.device,
             precision: str = "fp32") -> float:
    """Mean negative log-likelihood per target token over ``batches``."""
    was_training = model.training
    model.eval()
    nll = tokens = 0.0
    for batch in batches:
        batch = to_device(batch, device)
        with hardware.autocast(device, precision):
            sums = task.loss(model, batch)
        nll += sums.nll.item()
        tokens += sums.tokens
    model.train(was_training)
    return nll / max(tokens, 1)
