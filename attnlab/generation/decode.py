"""Generation for decoder-only models: the prompt is run once, then one token per step.

    prefill:  logits = model(prompt)              (fills the KV cache)
    step t:   y_t ~ p(· | y_<t)  or  argmax        (only y_{t-1} goes through the model)

Greedy by default; ``temperature`` > 0 samples from softmax(logits / T), optionally restricted
to the ``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p``.
Left-padded batches pass ``attention_mask`` (1 = real token); positions then count from each
row's first real token, as Hugging Face does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.cpu.attention import attention_kernel_
from attnlab.generation.sampling import check_decoding, next_tokens

if TYPE_CHECKING:
    from attnlab.generation.compiled import CompiledStep


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
    True stops generation (stop strings). The one-query steps' attention runs on attnlab's
    CPU kernel (:func:`~attnlab.cpu.attention.attention_kernel_`, applied here);
    :func:`attnlab.cpu.for_decoding`, which the CLI applies first, readies the rest.

    ``compiled``: every token after the prompt's first runs through that compiled one-token
    step against a static cache (``generation/compiled.py``), when prompt + output fit the
    model's context (past it, nanoGPT's crop needs the eager path)."""
    check_decoding(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty)
    attention_kernel_(model)
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
            logits = model(step_input, cache=cache,
                           attention_mask=None if mask is None else mask[:, start:length])[:, -1]
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
