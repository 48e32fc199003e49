"""Log-likelihoods of text under a decoder-only model: what scoring, not generating, needs.

    log p(y | x) = Σ_t log softmax(logits_t)[y_t]      logits_t = model(x ⧺ y_<t)[last]

Two entry points:

* :func:`token_logprobs`: every token of a batch of sequences given the tokens before it (the
  per-token terms of perplexity);
* :func:`rolling_nll`: the summed negative log-likelihood of one long text, read through a
  sliding window (perplexity, ``exp(nll / n)``);
* :func:`continuation_logprobs`: the summed log-likelihood of each of several continuations
  (multiple-choice scoring: one context, a continuation per choice). The tokens all of them
  share are run once, with a KV cache; the cache is then copied to one row per choice and every
  choice's remaining tokens go through the model as one right-padded batch: two forward calls
  per question, however many choices and tokens it has;
  :func:`grouped_continuation_logprobs` scores several questions in the same two calls.

The log-softmax is taken in float32 whatever the model's dtype (bf16 logits are cast first).
A context too long for the model's window is cut from the left as lm-evaluation-harness cuts it:
each request's model input is the last ``window + 1`` tokens of ``context ⧺ continuation``
without its last token, so every scored token keeps as much context as fits (the requests of
one question then share less, or nothing, and cost more).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.cpu.prepare import decoding_kernels_
from attnlab.errors import BadInput


def _picked(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[targets]`` in float32: ``(..., vocab)``, ``(...)`` -> ``(...)``."""
    return logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def token_logprobs(model: nn.Module, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """``ids (batch, seq)`` -> ``(batch, seq − 1)`` float32, entry ``t`` being
    ``log p(ids[:, t + 1] | ids[:, : t + 1])``: the first token is conditioned on, never scored.

    ``attention_mask (batch, seq)`` (1 = real token) marks left padding, as for
    :meth:`GPT.forward`; the entries of padded positions are meaningless. The whole sequence is
    one forward pass, so ``seq`` may not exceed the model's context (``check_length``).
    """
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise BadInput(f"token_logprobs needs (batch, length >= 2) token ids, got shape "
                       f"{tuple(ids.shape)}")
    model.eval()
    logits = model(ids, attention_mask=attention_mask)  # (batch, seq, vocab)
    return _picked(logits[:, :-1], ids[:, 1:])


def _inputs(context: Sequence[int], continuation: Sequence[int],
            window: int | None) -> list[int]:
    """The model's input for one continuation: ``(context ⧺ continuation)[:-1]``, of at most
    ``window`` tokens (its last ones); the scored positions are its last ``len(continuation)``."""
    whole = [*context, *continuation]
    if window is not None:
        if len(continuation) > window:
            raise BadInput(f"a continuation of {len(continuation)} tokens does not fit the "
                           f"model's context of {window} tokens")
        whole = whole[-(window + 1):]
    return whole[:-1]


Request = tuple[Sequence[int], Sequence[int]]  # (context ids, continuation ids)


@torch.no_grad()
def continuation_logprobs(model: nn.Module, requests: Sequence[Request],
                          window: int | None = None) -> Tensor:
    """``(n,)`` float32: ``Σ_t log p(c_t | x ⧺ c_<t)`` for each request ``(x, c)``.

    Args:
        model: a decoder-only model with ``features(ids, cache=, attention_mask=)``,
            ``lm_head`` and ``new_cache(capacity, rolling)``, as :class:`attnlab.GPT`.
        requests: ``(context_ids, continuation_ids)`` pairs, at least one token each (the
            harness conditions an empty text on the BOS or EOS id). A multiple-choice question
            gives one per choice, all with the same context.
        window: the most tokens the model sees at once; default ``model.config.context`` (None:
            no limit). Longer inputs lose their first tokens, per request (module docstring).

    How: let ``x_i = (context_i ⧺ c_i)[:-1]`` be request ``i``'s input, of length ``L_i``, and
    ``s`` the length of the prefix all ``x_i`` share (the whole context when it is one, unless
    a window cut the inputs differently). The prefix runs once, ``(1, s)``, filling the KV
    cache; the cache is copied to ``n`` rows and the rest, ``x_i[s:]`` right-padded to
    ``(n, max L_i − s)``, runs on top of it. The logits at positions ``L_i − len(c_i) … L_i − 1``
    predict ``c_i``. Right padding comes after every real token, so under the causal mask no
    real token sees it; the attention mask says so as well, and padded positions' logits are
    never read. :func:`grouped_continuation_logprobs` does the same for several questions at
    once.
    """
    return grouped_continuation_logprobs(model, [requests], window)[0]


@torch.no_grad()
def grouped_continuation_logprobs(model: nn.Module, groups: Sequence[Sequence[Request]],
                                  window: int | None = None) -> list[Tensor]:
    """:func:`continuation_logprobs` of each group (a question's choices), in one batch.

    The ``G`` groups' shared prefixes, of lengths ``s_g``, run as one left-padded batch
    ``(G, max s_g)``; the cache is copied to one row per request (row ``r`` of group ``g(r)``)
    and the rests run right-padded, ``(R, max rest)``. The attention mask marks the real tokens
    of each row (its group's prefix, then its own rest), and positions count real tokens only,
    so every row computes what it would alone. A batch wider than the window is split in two
    (one group alone is never wider). Returns ``G`` tensors ``(n_g,)`` float32.
    """
    if not groups or any(not g for g in groups):
        raise BadInput("nothing to score: no (context, continuation) pair")
    if any(len(x) == 0 for g in groups for x, _ in g):
        raise BadInput("every context must hold at least one token (e.g. the BOS id)")
    if any(len(c) == 0 for g in groups for _, c in g):
        raise BadInput("every continuation must hold at least one token")
    model.eval()
    if window is None:
        window = model.config.context
    inputs = [[_inputs(x, c, window) for x, c in g] for g in groups]
    shared = [len(os.path.commonprefix(rows)) for rows in inputs]  # works on any sequences
    width = max(shared) + max(len(x) - s for rows, s in zip(inputs, shared, strict=True)
                              for x in rows)
    if window is not None and width > window and len(groups) > 1:  # halves fit sooner or later
        half = len(groups) // 2
        return (grouped_continuation_logprobs(model, groups[:half], window)
                + grouped_continuation_logprobs(model, groups[half:], window))
    return _score(model, groups, inputs, shared)


# Below this many tokens, a batch-wide common prefix is not run apart: the extra forward call
# would cost about what it saves.
_MIN_COMMON = 8


def _score(model: nn.Module, groups: Sequence[Sequence[Request]], inputs: list[list[list[int]]],
           shared: list[int]) -> list[Tensor]:
    """The forward calls of :func:`grouped_continuation_logprobs`, and the picking.

    Up to three calls, each filling the same KV cache: the tokens every question of the batch
    starts with (``c``: K pinned demonstrations, an instruction), ``(1, c)``, when there are
    at least ``_MIN_COMMON``; each question's own shared prefix, ``(G, max s_g − c)`` left-padded;
    each request's rest, ``(R, max rest)`` right-padded. A row's padding may sit between real
    tokens (after the common part); the attention mask hides it and positions count real tokens
    only, so no row sees another's tokens or its own padding.
    """
    decoding_kernels_(model)  # integer layers and one-query steps on the CPU kernels
    device = next(model.parameters()).device
    owner = [g for g, rows in enumerate(inputs) for _ in rows]  # the group of each request
    flat = [x for rows in inputs for x in rows]  # (R,) inputs
    conts = [c for g in groups for _, c in g]
    rests = [len(x) - shared[g] for x, g in zip(flat, owner, strict=True)]
    common = len(os.path.commonprefix([rows[0][:s] for rows, s in zip(inputs, shared,
                                                                      strict=True)]))
    if len(groups) == 1 or common < _MIN_COMMON:
        common = 0
    own = max(shared) - common  # the widest question-specific prefix
    # a full cache even for a sliding window: padding sits between a row's real tokens
    cache = model.new_cache(capacity=max(shared) + max(rests), rolling=False)
    first = None  # (1, common, d_model): the states of the batch's common tokens
    if common:
        first = model.features(torch.tensor([flat[0][:common]], device=device), cache=cache)
        cache.reorder(torch.zeros(len(groups), dtype=torch.long, device=device))
    head = None  # (G, own, d_model): each question's own prefix states, left-padded
    prefix_mask = torch.ones(len(groups), common + own, dtype=torch.bool)  # built on the host
    prefix_mask[:, common:] = False
    if own:
        ids = torch.zeros(len(groups), own, dtype=torch.long)
        for g, (rows, s) in enumerate(zip(inputs, shared, strict=True)):
            if s > common:
                ids[g, own - (s - common):] = torch.tensor(rows[0][common:s])
                prefix_mask[g, common + own - (s - common):] = True
        padded = not bool(prefix_mask.all())
        head = model.features(ids.to(device), cache=cache,
                              attention_mask=prefix_mask.to(device) if padded else None)
    if common or own:  # every request continues from its own copy of its question's cache
        cache.reorder(torch.tensor(owner, device=device))
    tail = None  # (R, max rest, d_model): each request's states after its prefix
    if max(rests) > 0:
        ids = torch.zeros(len(flat), max(rests), dtype=torch.long)
        rest_mask = torch.zeros(len(flat), max(rests), dtype=torch.bool)
        for r, (x, g) in enumerate(zip(flat, owner, strict=True)):
            ids[r, : rests[r]] = torch.tensor(x[shared[g]:])
            rest_mask[r, : rests[r]] = True
        mask = torch.cat([prefix_mask[owner], rest_mask], 1)  # (R, common + own + max rest)
        tail = model.features(ids.to(device), cache=cache, attention_mask=mask.to(device))
    # the states that predict each c_r, (len(c_r), d_model) each, in order: only they go
    # through the vocabulary projection (of a 300-token prompt, a few positions are read)
    rows = []
    for r, (x, g, c) in enumerate(zip(flat, owner, conts, strict=True)):
        start, s = len(x) - len(c), shared[g]  # the first input position whose states are read
        if start < common:  # in the common part
            rows.append(first[0, start:common])
        if start < s and s > common:  # in the question's own prefix, at the right of its row
            rows.append(head[g, own - (s - max(start, common)) : own])
        if len(x) > s:
            rows.append(tail[r, max(start - s, 0) : rests[r]])
    targets = torch.tensor([t for c in conts for t in c], device=device)
    which = torch.tensor([r for r, c in enumerate(conts) for _ in c], device=device)
    slot = torch.tensor([t for c in conts for t in range(len(c))], device=device)
    per_token = torch.zeros(len(flat), max(len(c) for c in conts), device=device)
    logits = model.lm_head(torch.cat(rows))  # (Σ len(c_r), vocab)
    per_token[which, slot] = _picked(logits, targets)  # (R, longest continuation)
    sums = per_token.sum(-1)  # zeros past each continuation's end; the same order every run
    return list(sums.split([len(g) for g in groups]))


def windows(n_tokens: int, block: int, stride: int) -> list[tuple[int, int, int]]:
    """The sliding windows over ``n_tokens`` tokens: ``(begin, end, first)`` each, the window
    being tokens ``begin … end − 1`` and the tokens it scores ``first … end − 1``.

    Windows start every ``stride`` tokens and hold at most ``block``; each scores only what
    the ones before left unscored, so every token but the first is scored exactly once, with
    at least ``block − stride ≥ 1`` tokens of context once the first window has passed (the
    strided evaluation of Hugging Face's perplexity guide). The last window ends the text.
    """
    if block < 2 or not 1 <= stride < block:  # a window needs a token of context to score
        raise BadInput(f"sliding window: need block >= 2 and 1 <= stride < block, got "
                       f"block={block}, stride={stride}")
    spans, done = [], 1  # token 0 has no context: never scored
    for begin in range(0, max(n_tokens - 1, 1), stride):
        end = min(begin + block, n_tokens)
        if end > done:
            spans.append((begin, end, done))
            done = end
        if end == n_tokens:
            break
    return spans


@torch.no_grad()
def rolling_nll(model: nn.Module, ids: Sequence[int] | Tensor, block: int, stride: int,
                batch: int = 1) -> tuple[float, int]:
    """``(Σ −log p(x_t | x_{begin(t)} … x_{t−1}), n)`` over every token ``t ≥ 1`` of one text
    ``ids (n_tokens,)``, read through the sliding :func:`windows`; perplexity is
    ``exp(nll / n)``, with ``n = n_tokens − 1``.

    Windows of equal length run ``batch`` at a time as one ``(batch, block)`` forward pass, and
    only the positions that predict a scored token go through the vocabulary projection. The
    sum is accumulated in float64 (a long text adds up tens of thousands of terms).
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() < 2:
        raise BadInput(f"perplexity needs a text of at least 2 tokens, got {ids.numel()}")
    if batch < 1:
        raise BadInput(f"batch must be >= 1, got {batch}")
    model.eval()
    device = next(model.parameters()).device
    spans = windows(ids.numel(), block, stride)
    total, count = torch.zeros((), dtype=torch.float64), 0
    i = 0
    while i < len(spans):  # consecutive windows of the same length share a forward pass
        j = i + 1
        while (j < len(spans) and j - i < batch
               and spans[j][1] - spans[j][0] == spans[i][1] - spans[i][0]):
            j += 1
        group = spans[i:j]
        x = torch.stack([ids[b:e] for b, e, _ in group]).to(device)  # (g, length)
        states = model.features(x)
        # position p predicts token p + 1: a window's scored tokens first … end − 1 are
        # predicted by its positions first − begin − 1 … end − begin − 2
        picked = torch.cat([states[k, f - b - 1 : e - b - 1] for k, (b, e, f) in enumerate(group)])
        targets = torch.cat([ids[f:e] for _, e, f in group]).to(device)
        total -= _picked(model.lm_head(picked), targets).double().sum().cpu()
        count += targets.numel()
        i = j
    return float(total), count


__all__ = ["token_logprobs", "continuation_logprobs", "grouped_continuation_logprobs",
           "rolling_nll", "windows"]
