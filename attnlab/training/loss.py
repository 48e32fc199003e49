"""Label-smoothed cross-entropy (paper section 5.4, ε_ls = 0.1), padding excluded.

The target distribution puts 1 − ε on the true class and spreads ε uniformly over the K real
classes — every class except padding, which gets exactly 0:

    q(c) = (1 − ε)·[c = y] + ε / K   for c ≠ pad,      q(pad) = 0,      K = V − 1

    loss = −Σ_c q(c) log p(c) = (1 − ε)·(−log p(y)) + ε · mean_{c ≠ pad}(−log p(c))

(with 5 real classes and ε = 0.1: 0.92 on the target, 0.02 on each other class). Positions
whose target is padding contribute nothing. Returned sums let callers normalise by the token
count of the whole (possibly distributed, accumulated) batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossSums:
    loss: Tensor  # Σ smoothed loss over real target tokens (differentiable)
    nll: Tensor  # Σ −log p(y), for perplexity (detached)
    tokens: int  # number of real target tokens


def smoothed_target(target: Tensor, vocab_size: int, epsilon: float, pad_id: int) -> Tensor:
    """The distribution q above as a dense ``(..., vocab)`` tensor (for tests and teaching)."""
    k = vocab_size - 1
    q = torch.full((*target.shape, vocab_size), epsilon / k)
    q.scatter_(-1, target[..., None], 1 - epsilon + epsilon / k)
    q[..., pad_id] = 0.0
    return q


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float = 0.1,
                        pad_id: int | None = 0) -> LossSums:
    """``logits (batch, seq, vocab)``, ``target (batch, seq)`` -> sums over real tokens.

    ``pad_id=None``: every position counts and ε spreads over all V classes (language models).
    """
    if pad_id is not None:
        real = target != pad_id
        logits, target = logits[real], target[real]  # (tokens, vocab), (tokens,)
        n_tokens = int(real.sum())
    else:
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        n_tokens = target.numel()
    logp = logits.float().log_softmax(dim=-1)
    nll = -logp.gather(-1, target[:, None]).squeeze(-1)
    if epsilon == 0.0:
        return LossSums(nll.sum(), nll.detach().sum(), n_tokens)
    total = logp.sum(-1)
    if pad_id is not None:
        total = total - logp[:, pad_id]
    uniform = -total / (logp.shape[-1] - (pad_id is not None))
    loss = (1 - epsilon) * nll + epsilon * uniform
    return LossSums(loss.sum(), nll.detach().sum(), n_tokens)
