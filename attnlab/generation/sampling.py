"""The sampling step: from a step's logits to the next token of each row.

    greedy:    y = argmax_v logits[v]
    sampled:   y ~ softmax(filter(logits) / T)

``filter`` keeps the ``top_k`` most likely tokens and the smallest set whose probability reaches
``top_p`` (the nucleus); CTRL's repetition penalty first scales the logits of tokens already
seen. One step for every decoding loop: ``generate``, ``chat`` and ``serve`` all call
:func:`next_tokens`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import BadInput


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to −inf every logit outside the top-k and outside the nucleus of mass ``top_p``."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass of the tokens before it already reaches top_p
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty: logits of tokens in ``seen (batch, n)`` are divided by
    ``penalty`` when positive and multiplied by it when negative."""
    picked = logits.gather(-1, seen)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(-1, seen, picked)


def check_decoding(ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                   top_p: float | None, repetition_penalty: float) -> None:
    """Reject settings that would otherwise be ignored silently or fail deep inside torch."""
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise BadInput(f"the prompt must be (batch, length >= 1) token ids, got shape "
                       f"{tuple(ids.shape)}")
    if max_new_tokens < 0:
        raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:  # also catches NaN
        raise BadInput(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise BadInput(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
    if not repetition_penalty > 0:
        raise BadInput(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")


def next_tokens(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None,
                seen: Tensor | None = None, repetition_penalty: float = 1.0) -> Tensor:
    """``logits (rows, vocab)`` -> the next token of each row ``(rows,)``: the argmax at
    ``temperature`` 0, else a sample from softmax(filtered logits / T) drawn with
    ``generator``. ``seen (rows, n)``: the tokens the repetition penalty applies to."""
    if repetition_penalty != 1.0 and seen is not None:
        logits = penalise_repeats(logits, seen, repetition_penalty)
    if temperature > 0:
        probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return logits.argmax(-1)
