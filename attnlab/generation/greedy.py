"""Batched greedy decoding for the encoder–decoder.

    y_t = argmax_v p(v | y_<t, x)

The encoder runs once; with ``use_cache`` each step feeds only the newest token and the
decoder's KV cache supplies the rest (cross-attention keys/values are computed at the first
step and reused). A sentence stops at eos; the batch stops when all have, or at ``max_len``
(default: source length + 50, as in the paper).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.models import Transformer


@torch.no_grad()
def greedy_decode(model: Transformer, src_ids: Tensor, max_len: int | None = None,
                  use_cache: bool = True, return_logits: bool = False):
    """``src_ids (batch, src_len)`` -> ``tokens (batch, out_len)`` starting with bos.

    Finished rows are filled with pad after their eos. With ``return_logits`` also returns the
    logits of each step ``(batch, out_len - 1, vocab)``.
    """
    cfg = model.config
    batch = src_ids.shape[0]
    if max_len is None:
        max_len = src_ids.shape[1] + 50
    max_len = min(max_len, cfg.max_len)
    memory, src_mask = model.encode(src_ids)
    tokens = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)
    cache = model.new_cache(capacity=max_len) if use_cache else None
    all_logits = []
    pad_column = torch.zeros(cfg.target_vocab_size, dtype=torch.bool, device=src_ids.device)
    pad_column[cfg.pad_id] = True  # padding is never a word of the output
    for _ in range(max_len - 1):
        step_input = tokens[:, -1:] if use_cache else tokens
        logits = model.decode(step_input, memory, src_mask, cache=cache)[:, -1]
        if return_logits:
            all_logits.append(logits)
        next_token = logits.masked_fill(pad_column, float("-inf")).argmax(-1)
        next_token = next_token.masked_fill(done, cfg.pad_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        done |= next_token == cfg.eos_id
        if done.all():
            break
    if return_logits:
        return tokens, torch.stack(all_logits, dim=1)
    return tokens
