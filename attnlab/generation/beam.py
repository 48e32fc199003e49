"""Batched beam search, one search for both architectures (the paper, section 6.1: beam 4,
α = 0.6; transformers' ``generate(num_beams=k)`` for decoder-only models).

Each sentence keeps ``k`` running hypotheses. At every step all ``k · V`` one-token extensions
are scored by their summed log-probability, and the best ``2k`` are examined in order:

* an extension ending in eos, ranked among the first ``k``, becomes a *finished* hypothesis,
  scored by its length-normalised log-probability;
* the best ``k`` extensions not ending in eos become the next running hypotheses (the KV cache
  rows are reordered to follow them).

A sentence is done when it holds ``k`` finished hypotheses; the search stops when every
sentence is done, or after ``max_new`` tokens (where the running hypotheses are finished as
they stand). The answer is each sentence's best finished hypothesis. Length normalisation, for
|Y| the generated tokens (eos included; a decoder-only model's prompt not counted):

    gnmt     score = log P(Y) / ((5 + |Y|) / 6)^α      (Wu et al., 2016; used by the paper)
    average  score = log P(Y) / |Y|^α                  (transformers' ``length_penalty``)

With ``k = 1`` this is greedy decoding, token for token. To reproduce transformers'
``generate(num_beams=k)`` use ``penalty="average"`` and theirs with ``early_stopping=True``
(their default stops on a heuristic instead) and no forced eos or repetition rules.

The search (:func:`search`) knows nothing of the model: it drives a *step* object, which
returns the next-token logits of every hypothesis and reorders its cache to follow the
survivors (:class:`Steps`). The encoder–decoder's step is
:class:`~attnlab.generation.compiled.DecoderSteps` (the encoder runs once, its memory repeated
for the k beams; :func:`beam_search`); the decoder-only model's is :class:`PromptSteps` (the
prompt runs once a sentence, its cache rows then copied to the k beams; :func:`beam_generate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

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


def check_beam(beam_size: int, alpha: float, penalty: str) -> None:
    """The search's settings, each problem one ``BadInput`` line."""
    if penalty not in PENALTIES:
        raise BadInput(f"unknown length penalty {penalty!r}; choose from {PENALTIES}")
    if beam_size < 1:
        raise BadInput(f"beam size must be >= 1, got {beam_size}")
    if not math.isfinite(alpha):
        raise BadInput(f"alpha must be a finite number, got {alpha}")


class Steps(Protocol):
    """What a model gives the search. ``rows`` = batch · k, sentence b's beams in rows
    ``b·k .. b·k + k − 1``."""

    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens (rows, 1)``, each hypothesis's newest token -> next-token logits
        ``(rows, V)``."""

    def reorder(self, index: Tensor) -> None:
        """Keep the cache rows ``index (rows,)``: the survivors' histories."""


@torch.no_grad()
def search(steps: Steps, start: Tensor, beam_size: int, max_new: int, eos_id: int | None,
           alpha: float = 0.6, penalty: str = "gnmt", fill_id: int = 0,
           banned: int | None = None,
           on_step: Callable[[], None] | None = None) -> tuple[Tensor, Tensor]:
    """The beam search of the module docstring over ``steps``. ``start (batch, n)``: the tokens
    every hypothesis begins with (bos; a prompt), kept at the front of the answer. At most
    ``max_new`` tokens are generated; ``eos_id`` None: no hypothesis ends before that.
    ``banned``: a token never emitted (an encoder–decoder's pad), masked before the
    log-softmax. ``on_step()`` is called after each step (timing).

    Returns ``tokens (batch, n + generated)``, filled with ``fill_id`` after a shorter
    hypothesis' eos, and the normalised score of each ``(batch,)``."""
    check_beam(beam_size, alpha, penalty)
    batch, n = start.shape
    k, device = beam_size, start.device
    if max_new < 1:
        return start, torch.zeros(batch, device=device)
    width = n + max_new
    tokens = start.repeat_interleave(k, dim=0)  # (batch·k, n)
    running = torch.full((batch, k), float("-inf"), device=device)
    running[:, 0] = 0.0  # at the start the k beams are copies: keep one alive
    finished_scores = torch.full((batch, k), float("-inf"), device=device)
    finished_tokens = torch.full((batch, k, width), fill_id, dtype=torch.long, device=device)
    offsets = torch.arange(batch, device=device)[:, None] * k
    ranks = torch.arange(2 * k, device=device)[None]
    for length in range(1, max_new + 1):  # ``length`` tokens generated after this step
        logits = steps(tokens[:, -1:])
        if banned is not None:
            logits[:, banned] = float("-inf")
        logp = logits.float().log_softmax(-1)  # (batch·k, V)
        vocab = logp.shape[-1]
        total = (running.view(-1, 1) + logp).view(batch, k * vocab)
        top_scores, top_index = total.topk(2 * k, dim=-1)  # (batch, 2k)
        beam, token = top_index // vocab, top_index % vocab
        last = length == max_new
        ends = torch.full_like(token, last, dtype=torch.bool)
        if eos_id is not None:
            ends |= token == eos_id

        # Finished: extensions that end here and rank among the first k, while the sentence
        # still has room; keep the k best finished of old and new.
        done = (finished_scores > float("-inf")).all(-1, keepdim=True)
        accept = ends & (ranks < k) & ~done
        normalised = top_scores / length_penalty(length, alpha, penalty)
        candidates = torch.where(accept, normalised, torch.full_like(normalised, float("-inf")))
        prefix = tokens.view(batch, k, -1).gather(
            1, beam[..., None].expand(-1, -1, tokens.shape[1]))  # (batch, 2k, n + length − 1)
        new_rows = torch.cat([prefix, token[..., None]], dim=-1)
        new_rows = torch.nn.functional.pad(new_rows, (0, width - new_rows.shape[-1]),
                                           value=fill_id)
        merged_scores = torch.cat([finished_scores, candidates], dim=1)
        merged_rows = torch.cat([finished_tokens, new_rows], dim=1)
        finished_scores, keep = merged_scores.topk(k, dim=1)
        finished_tokens = merged_rows.gather(1, keep[..., None].expand(-1, -1, width))
        if on_step is not None:
            on_step()
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
    generated = max_new  # the width: up to the longest best hypothesis' eos
    if eos_id is not None:
        is_eos = (out[:, n:] == eos_id).int()
        ends_at = torch.where(is_eos.any(1), is_eos.argmax(1) + 1,
                              torch.full_like(best, max_new))
        generated = int(ends_at.max())
    return out[:, : n + generated], finished_scores.gather(1, best[:, None])[:, 0]


# --- the encoder–decoder ------------------------------------------------------------------------
@torch.no_grad()
def beam_search(model: Transformer, src_ids: Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None, penalty: str = "gnmt",
                return_scores: bool = False, compiled: CompiledStep | None = None):
    """``src_ids (batch, src_len)`` -> ``tokens (batch, out_len)`` starting with bos, padded
    after eos (the layout of :func:`~attnlab.generation.seq2seq.greedy_decode`); with
    ``return_scores`` also the normalised score of each returned hypothesis ``(batch,)``.
    ``max_len``: the output's length, bos included (default: source length + 50). Pad is
    never emitted. ``compiled``: every step after the first runs through that compiled
    one-token step (``generation/compiled.py``)."""
    decoding_kernels_(model)  # integer layers and one-query steps on the CPU kernels
    check_beam(beam_size, alpha, penalty)
    cfg, k = model.config, beam_size
    max_len = min(src_ids.shape[1] + 50 if max_len is None else max_len, cfg.max_len)
    memory, src_mask = model.encode(src_ids)
    memory = memory.repeat_interleave(k, dim=0)  # (batch·k, src_len, d): one copy per beam
    src_mask = src_mask.repeat_interleave(k, dim=0)
    steps = DecoderSteps(model, memory, src_mask, max_len, compiled)
    start = torch.full((src_ids.shape[0], 1), cfg.bos_id, dtype=torch.long,
                       device=src_ids.device)
    out, scores = search(steps, start, k, max_len - 1, cfg.eos_id, alpha, penalty,
                         fill_id=cfg.pad_id, banned=cfg.pad_id)
    return (out, scores) if return_scores else out


# --- the decoder-only model ---------------------------------------------------------------------
class PromptSteps:
    """A decoder-only model's steps for :func:`search`: the first call runs each sentence's
    prompt once and copies its cache rows to the k beams; every later call runs the newest
    token of each hypothesis against the cache. ``attention_mask (batch, prompt_len)``: 1 at
    real tokens of a left-padded batch (positions count from each row's first real token)."""

    def __init__(self, model, prompt: Tensor, beam_size: int, max_new: int,
                 attention_mask: Tensor | None = None):
        self.model, self.prompt, self.k = model, prompt, beam_size
        batch, n = prompt.shape
        self.cache = model.new_cache(capacity=n + max_new)
        self.mask = None  # (rows, prompt + new): the prompt's padding, then real tokens
        if attention_mask is not None:
            self.mask = torch.cat([attention_mask.bool(),
                                   attention_mask.new_ones(batch, max_new, dtype=torch.bool)], 1)
        self.length = 0  # positions in the cache

    def __call__(self, tokens: Tensor) -> Tensor:
        if self.length == 0:  # the prompt (``tokens`` repeats its last token)
            n = self.prompt.shape[1]
            logits = self.model(self.prompt, cache=self.cache,
                                attention_mask=None if self.mask is None else self.mask[:, :n])
            copies = torch.arange(self.prompt.shape[0], device=self.prompt.device)
            copies = copies.repeat_interleave(self.k)
            self.cache.reorder(copies)
            if self.mask is not None:
                self.mask = self.mask[copies]
            self.length = n
            return logits[copies, -1]
        self.length += 1
        mask = None if self.mask is None else self.mask[:, : self.length]
        return self.model(tokens, cache=self.cache, attention_mask=mask)[:, -1]

    def reorder(self, index: Tensor) -> None:
        # the mask needs none: the search reorders within a sentence, whose rows are equal
        self.cache.reorder(index)


def check_beam_generate(config, prompt_len: int, max_new_tokens: int) -> None:
    """Beam search keeps the whole sequence in the model's context (no cropping, which would
    change every beam's history): a longer one is one ``BadInput`` line."""
    if max_new_tokens < 0:
        raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    context = config.context
    if context is not None and prompt_len + max_new_tokens > context:
        raise BadInput(f"max_new_tokens {max_new_tokens} after a prompt of {prompt_len} tokens "
                       f"exceeds the model's context of {context}: beam search keeps the whole "
                       "sequence in it")


@torch.no_grad()
def beam_generate(model, ids: Tensor, max_new_tokens: int, beam_size: int = 4,
                  alpha: float = 1.0, penalty: str = "average", eos_id: int | None = None,
                  attention_mask: Tensor | None = None, return_scores: bool = False,
                  on_step: Callable[[], None] | None = None):
    """Beam search for a decoder-only model: ``ids (batch, prompt_len)`` -> ``(batch,
    prompt_len + new)``, the best hypothesis after each prompt, filled with ``eos_id`` after a
    shorter one's eos (as :func:`~attnlab.generation.decode.generate` pads finished rows).
    Defaults are transformers' (``penalty="average"``, ``length_penalty`` α = 1);
    ``attention_mask``: a left-padded batch, as ``generate`` takes it. With
    ``return_scores`` also each answer's normalised score ``(batch,)``."""
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise BadInput(f"the prompt must be (batch, length >= 1) token ids, got shape "
                       f"{tuple(ids.shape)}")
    check_beam(beam_size, alpha, penalty)
    check_beam_generate(model.config, ids.shape[1], max_new_tokens)
    decoding_kernels_(model)
    model.eval()
    steps = PromptSteps(model, ids, beam_size, max_new_tokens, attention_mask)
    out, scores = search(steps, ids, beam_size, max_new_tokens, eos_id, alpha, penalty,
                         fill_id=0 if eos_id is None else eos_id, on_step=on_step)
    return (out, scores) if return_scores else out


__all__ = ["PENALTIES", "PromptSteps", "Steps", "beam_generate", "beam_search", "check_beam",
           "check_beam_generate", "length_penalty", "search"]
