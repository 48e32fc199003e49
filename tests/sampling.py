"""The sampling step's independent reference, and a model whose logits are chosen.

:func:`reference_distribution` is transformers' logits processors in the order its ``generate``
applies them (the repetition penalty, then temperature, top-k and top-p), softmaxed;
:func:`reference_draws` draws from it with ``torch.multinomial`` and a seeded generator, as
every attnlab decoding loop must. :func:`constant_logits_model` is a real attnlab GPT whose
last norm outputs a constant one-hot vector, so its ``lm_head`` yields the same chosen logits
at every position, whatever the tokens, the cache or the batch: any caller's draws can then be
recomputed from those logits alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reference_distribution(logits: Tensor, seen: Tensor | None = None, temperature: float = 1.0,
                           top_k: int | None = None, top_p: float | None = None,
                           repetition_penalty: float = 1.0) -> Tensor:
    """``logits (rows, vocab)`` -> the probabilities transformers samples from: its
    RepetitionPenalty, Temperature, TopK and TopP processors, then softmax. ``seen (rows, n)``:
    the token ids so far (the prompt included)."""
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    steps = [RepetitionPenaltyLogitsProcessor(repetition_penalty)] if seen is not None else []
    steps.append(TemperatureLogitsWarper(temperature))
    if top_k is not None:
        steps.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        steps.append(TopPLogitsWarper(top_p))
    scores = logits.clone()
    for step in steps:
        scores = step(seen, scores)
    return scores.softmax(-1)


def reference_draws(logits: Tensor, prompts: list[list[int]], n: int, generator: torch.Generator,
                    temperature: float, top_k: int | None = None, top_p: float | None = None,
                    repetition_penalty: float = 1.0) -> list[list[int]]:
    """``n`` tokens for each of ``prompts`` (equal lengths) when every step's logits are
    ``logits (vocab,)``: one ``torch.multinomial`` over all rows a step, with ``generator``."""
    ids = torch.tensor(prompts)
    for _ in range(n):
        rows = logits.expand(ids.shape[0], -1)
        probs = reference_distribution(rows, ids if repetition_penalty != 1.0 else None,
                                       temperature, top_k, top_p, repetition_penalty)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
    return ids[:, len(prompts[0]):].tolist()


def constant_logits_model(logits: Tensor, **config):
    """A gpt-mini of one layer over ``len(logits)`` tokens whose output is ``logits`` at every
    position, exactly: the last LayerNorm's scale is 0 and its bias the unit vector e_0, and the
    output layer's only non-zero column (column 0) is ``logits``. ``config``: more settings
    (the special tokens' ids)."""
    from attnlab.build import build_model
    from attnlab.config import ModelConfig

    config = ModelConfig.from_preset("gpt-mini", vocab_size=len(logits), d_model=16, n_heads=2,
                                     d_ff=32, n_decoder_layers=1, max_len=256, dropout=0.0,
                                     tie_embeddings=False, **config)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        model.blocks.norm.weight.zero_()
        model.blocks.norm.bias.zero_()
        model.blocks.norm.bias[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = logits
    return model
