"""The reference perplexity: Hugging Face's strided recipe for fixed-length models, written
out on a transformers model, against which ``attnlab evaluate lm`` is checked."""

from __future__ import annotations

import torch


def strided_nll(model, ids: torch.Tensor, block: int, stride: int) -> tuple[float, int]:
    """``(Σ -log p, tokens scored)`` over ``ids (1, n)``: windows of ``block`` tokens every
    ``stride``, each scoring only the tokens the previous window did not (labels -100 before
    them); the loss shifts labels by one, so a window's first token is never scored."""
    nll, n, prev_end = 0.0, 0, 0
    for begin in range(0, ids.shape[1], stride):
        end = min(begin + block, ids.shape[1])
        labels = ids[:, begin:end].clone()
        labels[:, : -(end - prev_end)] = -100
        scored = int((labels[:, 1:] != -100).sum())
        with torch.no_grad():
            nll += float(model(ids[:, begin:end], labels=labels).loss) * scored
        n, prev_end = n + scored, end
        if end == ids.shape[1]:
            break
    return nll, n
