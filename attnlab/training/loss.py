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
                        pad_id: int = 0) -> LossSums:
    """``logits (batch, seq, vocab)``, ``target (batch, seq)`` -> sums over real tokens."""
    real = target != pad_id
    logits, target = logits[real], target[real]  # (tokens, vocab), (tokens,)
    logp = logits.float().log_softmax(dim=-1)
    nll = -logp.gather(-1, target[:, None]).squeeze(-1)
    k = logp.shape[-1] - 1
    uniform = -(logp.sum(-1) - logp[:, pad_id]) / k
    loss = (1 - epsilon) * nll + epsilon * uniform
    return LossSums(loss.sum(), nll.detach().sum(), int(real.sum()))
