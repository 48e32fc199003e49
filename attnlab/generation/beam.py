"""Batched beam search for the encoder–decoder (the paper, section 6.1: beam 4, α = 0.6).

Each sentence keeps ``k`` running hypotheses. At every step all ``k · V`` one-token extensions
are scored by their summed log-probability, and the best ``2k`` are examined in order:

* an extension ending in eos, ranked among the first ``k``, becomes a *finished* hypothesis,
  scored by its length-normalised log-probability;
* the best ``k`` extensions not ending in eos become the next running hypotheses (the KV cache
  rows are reordered to follow them).

A sentence is done when it holds ``k`` finished hypotheses; the search stops when every
sentence is done, or at ``max_len`` (where the running hypotheses are finished as they stand).
The answer is each sentence's best finished hypothesis. Length normalisation, for |Y| the
generated tokens (eos included):

    gnmt     score = log P(Y) / ((5 + |Y|) / 6)^α      (Wu et al., 2016; used by the paper)
    average  score = log P(Y) / |Y|^α                  (transformers' ``length_penalty``)

With ``k = 1`` this is greedy decoding, token for token. Neither search ever emits the pad token.
To reproduce transformers' ``generate(num_beams=k)`` use ``penalty="average"`` and theirs with
``early_stopping=True`` (their default stops on a heuristic instead) and no forced eos.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.cpu.prepare import decoding_kernels_
from attnlab.errors import BadInput
from attnlab.generation.compiled import CompiledStep, DecoderSteps
from attnlab.models import Transformer

PENALTIES = ("gnmt", "average")


def length_penalty(length: int, alpha: float, kind: str = "gnmt") -> float:
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    if kind == "average":
        return float(length) ** alpha
    raise BadInput(f"unknown length penalty {kind!r}; choose from {PENALTIES}")


@torch.no_grad()
def beam_search(model: Transformer, src_ids: Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None, penalty: str = "gnmt",
                return_scores: bool = False, compiled: CompiledStep | None = None):
    """``src_ids (batch, src_len)`` -> ``tokens (batch, out_len)`` starting with bos, padded
    after eos (the layout of :func:`greedy_decode`); with ``return_scores`` also the
    normalised score of each returned hypothesis ``(batch,)``. ``compiled``: every step after
    the first runs through that compiled one-token step (``generation/compiled.py``)."""
    decoding_kernels_(model)  # integer layers and one-query steps on the CPU kernels
    cfg, k, device = model.config, beam_size, src_ids.device
    if penalty not in PENALTIES:
        raise BadInput(f"unknown length penalty {penalty!r}; choose from {PENALTIES}")
    if k < 1:
        raise BadInput(f"beam size must be >= 1, got {k}")
    batch = src_ids.shape[0]
    max_len = min(src_ids.shape[1] + 50 if max_len is None else max_len, cfg.max_len)
    memory, src_mask = model.encode(src_ids)
    memory = memory.repeat_interleave(k, dim=0)  # (batch·k, src_len, d): one copy per beam
    src_mask = src_mask.repeat_interleave(k, dim=0)
    tokens = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    running = torch.full((batch, k), float("-inf"), device=device)
    running[:, 0] = 0.0  # at the start the k beams are copies: keep one alive
    finished_scores = torch.full((batch, k), float("-inf"), device=device)
    finished_tokens = torch.full((batch, k, max_len), cfg.pad_id, dtype=torch.long,
                                 device=device)
    offsets = torch.arange(batch, device=device)[:, None] * k
    ranks = torch.arange(2 * k, device=device)[None]
    steps = DecoderSteps(model, memory, src_mask, max_len, compiled)
    for length in range(1, max_len):  # ``length`` tokens generated after this step
        logits = steps(tokens[:, -1:])
        logits[:, cfg.pad_id] = float("-inf")  # padding is never a word of the output
        logp = logits.float().log_softmax(-1)  # (batch·k, V)
        vocab = logp.shape[-1]
        total = (running.view(-1, 1) + logp).view(batch, k * vocab)
        top_scores, top_index = total.topk(2 * k, dim=-1)  # (batch, 2k)
        beam, token = top_index // vocab, top_index % vocab
        last = length == max_len - 1
        ends = (token == cfg.eos_id) | last

        # Finished: extensions that end here and rank among the first k, while the sentence
        # still has room; keep the k best finished of old and new.
        done = (finished_scores > float("-inf")).all(-1, keepdim=True)
        accept = ends & (ranks < k) & ~done
        normalised = top_scores / length_penalty(length, alpha, penalty)
        candidates = torch.where(accept, normalised, torch.full_like(normalised, float("-inf")))
        prefix = tokens.view(batch, k, -1).gather(
            1, beam[..., None].expand(-1, -1, tokens.shape[1]))  # (batch, 2k, length)
        new_rows = torch.cat([prefix, token[..., None]], dim=-1)
        new_rows = torch.nn.functional.pad(new_rows, (0, max_len - new_rows.shape[-1]),
                                           value=cfg.pad_id)
        merged_scores = torch.cat([finished_scores, candidates], dim=1)
        merged_rows = torch.cat([finished_tokens, new_rows], dim=1)
        finished_scores, keep = merged_scores.topk(k, dim=1)
        finished_tokens = merged_rows.gather(1, keep[..., None].expand(-1, -1, max_len))
        if last or (finished_scores > float("-inf")).all():
            break

        # Running: the best k extensions that did not end.
        alive = top_scores.masked_fill(ends, float("-inf"))
        running, pick = alive.topk(k, dim=1)
        order = (offsets + beam.gather(1, pick)).view(-1)  # rows of the previous step
        tokens = torch.cat([tokens[order], token.gather(1, pick).view(-1, 1)], dim=1)
        steps.reorder(order)

    best = finished_scores.argmax(dim=1)
    out = finished_tokens[torch.arange(batch, device=device), best]
    is_eos = (out[:, 1:] == cfg.eos_id).int()  # the width: up to the longest hypothesis' eos
    ends_at = torch.where(is_eos.any(1), is_eos.argmax(1) + 1, torch.full_like(best, max_len - 1))
    out = out[:, : int(ends_at.max()) + 1]
    return (out, finished_scores.gather(1, best[:, None])[:, 0]) if return_scores else out
