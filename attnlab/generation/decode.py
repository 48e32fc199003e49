"""Generation for decoder-only models: the prompt is run once, then one token per step.

    prefill:  logits = model(prompt)[:, -1]       (fills the KV cache; projects the last only)
    step t:   y_t ~ p(· | y_<t)  or  argmax        (only y_{t-1} goes through the model)

The sampling step (:func:`next_tokens`), the one every decoding loop draws its tokens with
(``generate``, ``chat`` and ``serve``)::

    greedy:    y = argmax_v logits[v]
    sampled:   y ~ softmax(filter(logits) / T)

``filter`` keeps the ``top_k`` most likely tokens and the smallest set whose probability reaches
``top_p`` (the nucleus); CTRL's repetition penalty first scales the logits of tokens already
seen. Left-padded batches pass ``attention_mask`` (1 = real token); positions then count from
each row's first real token, as Hugging Face does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.cpu.prepare import decoding_kernels_
from attnlab.errors import BadInput

if TYPE_CHECKING:
    from attnlab.generation.compiled import CompiledStep


# --- the sampling step -----------------------------------------------------------------------
MIN_TEMPERATURE = 1e-6  # the smallest sampling temperature: below it, use 0 (greedy)


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to −inf every logit outside the top-k and outside the nucleus of mass ``top_p``."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # a stable sort: tied logits keep their order (the lower id first), so which of them
        # the nucleus's edge cuts is defined (the live page filters with the same rule)
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
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
    check_sampling(temperature, top_k, top_p, repetition_penalty)


def check_sampling(temperature: float, top_k: int | None = None, top_p: float | None = None,
                   repetition_penalty: float = 1.0) -> None:
    """The settings of :func:`next_tokens` (every decoding loop that samples checks these);
    each message starts with the keyword's name, which the CLI turns into its flag."""
    if not temperature >= 0:  # also catches NaN
        raise BadInput(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if temperature != 0 and not MIN_TEMPERATURE <= temperature < float("inf"):
        # logits / T would overflow to ±inf, and softmax would give NaN
        raise BadInput(f"temperature must be 0 (greedy) or a finite number >= "
                       f"{MIN_TEMPERATURE:g}, got {temperature}")
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


# --- the loop ------------------------------------------------------------------------------------
def last_logits(model, ids: Tensor, cache=None, attention_mask: Tensor | None = None) -> Tensor:
    """The next-token logits ``(batch, vocab)`` after ``ids (batch, seq)``: the vocabulary
    projection of the last position only (a prompt's other positions need none: for a short
    prompt and a large vocabulary, projecting all of them costs as much as the blocks)."""
    if not hasattr(model, "features"):  # a model with only forward()
        return model(ids, cache=cache, attention_mask=attention_mask)[:, -1]
    hidden = model.features(ids, cache=cache, attention_mask=attention_mask)
    return model.lm_head(hidden[:, -1:])[:, 0]


@torch.no_grad()
def generate(model, ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, eos_id: int | None = None,
             generator: torch.Generator | None = None, on_token=None,
             compiled: CompiledStep | None = None) -> Tensor:
    """``ids (batch, prompt_len)`` -> ``(batch, prompt_len + new)``; stops early when every row
    has produced ``eos_id``; finished rows are padded with ``eos_id``. The model sees at most
    ``model.config.context`` tokens (its trained ``block_size``, else ``max_len``): a longer
    prompt or output is cropped to its last ``context`` tokens, at positions 0 .. context − 1,
    as nanoGPT does; generation itself may run as long as asked. ``on_token(new)`` is
    called with the ``(batch, n_new)`` tokens so far after each step (streaming); returning
    True stops generation (stop strings). On a CPU, the integer layers and the one-query
    steps' attention run on attnlab's kernels (:func:`~attnlab.cpu.prepare.decoding_kernels_`,
    applied here);
    :func:`attnlab.cpu.for_decoding`, which the CLI applies first, readies the rest.

    ``compiled``: every token after the prompt's first runs through that compiled one-token
    step against a static cache (``generation/compiled.py``), when prompt + output fit the
    model's context (past it, nanoGPT's crop needs the eager path)."""
    check_decoding(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty)
    decoding_kernels_(model)
    model.eval()
    batch, prompt_len = ids.shape
    total = prompt_len + max_new_tokens
    # The context never spans more positions than the model was trained on (nanoGPT's crop):
    # once it would, each step runs the last `window` tokens again from position 0, uncached.
    window = model.config.context
    start = 0 if window is None else max(0, prompt_len - window)  # the window's first token
    use_static = compiled is not None and (window is None or total <= window)
    # (a static cache is made from a growing one: no rolling cache for a sliding window then)
    cache = model.new_cache(capacity=total if window is None else min(total, window),
                            **({"rolling": False} if use_static else {}))
    mask = attention_mask
    if mask is not None:
        mask = torch.cat([mask.bool(), mask.new_ones(batch, max_new_tokens, dtype=torch.bool)], 1)
    out = ids.new_empty(batch, total)  # filled in place: no per-token concatenation
    out[:, :prompt_len] = ids
    length = prompt_len
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    step_input = ids[:, start:]
    static = None  # the compiled step's side, from the second new token on
    for i in range(max_new_tokens):
        if window is not None and length - start > window:  # slide the window by one
            start, cache = length - window, None
            step_input = out[:, start:length]
        if static is not None:
            logits = static(model, step_input)
        else:
            logits = last_logits(model, step_input, cache,
                                 None if mask is None else mask[:, start:length])
            if use_static and i + 1 < max_new_tokens:  # the prompt is in: on to the static cache
                from attnlab.generation.compiled import StaticDecoding, capacity_for

                static = StaticDecoding(compiled, cache, mask, length,
                                        capacity_for(total - 1, window))
        next_token = next_tokens(logits.float(), temperature, top_k, top_p, generator,
                                 out[:, :length], repetition_penalty)
        if eos_id is not None:
            next_token = next_token.masked_fill(done, eos_id)
            done |= next_token == eos_id
        out[:, length] = next_token
        length += 1
        step_input = out[:, length - 1 : length]
        if on_token is not None and on_token(out[:, prompt_len:length]):
            break
        if eos_id is not None and done.all():
            break
    return out[:, :length]
