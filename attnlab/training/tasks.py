"""What one batch means to the trainer: how many tokens it predicts and its loss.

The training loop (:mod:`attnlab.training.trainer`) is the same for every family; a task says
how a batch is fed to the model:

* :class:`Seq2Seq` — ``(src, tgt)``: ``model(src, tgt[:, :-1])`` predicts ``tgt[:, 1:]``;
* :class:`CausalLM` — ``(x, y)``: ``model(x)`` predicts ``y`` (``x`` shifted by one).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.training.loss import LossSums, label_smoothed_loss


class Seq2Seq:
    def __init__(self, pad_id: int, label_smoothing: float):
        self.pad_id, self.epsilon = pad_id, label_smoothing

    def target_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return int((batch[1][:, 1:] != self.pad_id).sum())

    def source_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return int((batch[0] != self.pad_id).sum())

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> LossSums:
        src, tgt = batch
        logits = model(src, tgt[:, :-1])
        return label_smoothed_loss(logits, tgt[:, 1:], self.epsilon, self.pad_id)


class CausalLM:
    def __init__(self, label_smoothing: float = 0.0):
        self.epsilon = label_smoothing

    def target_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return batch[1].numel()

    def source_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return 0

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> LossSums:
        x, y = batch
        return label_smoothed_loss(model(x), y, self.epsilon, pad_id=None)


@torch.no_grad()
def evaluate(model: nn.Module, task, batches, device: torch.device, bf16: bool = False) -> float:
    """Mean negative log-likelihood per target token over ``batches``."""
    was_training = model.training
    model.eval()
    nll = tokens = 0.0
    for batch in batches:
        batch = tuple(t.to(device) for t in batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            sums = task.loss(model, batch)
        nll += sums.nll.item()
        tokens += sums.tokens
    model.train(was_training)
    return nll / max(tokens, 1)
