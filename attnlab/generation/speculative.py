"""Greedy decoding that guesses several tokens ahead and lets the model check them at once.

Decoding one token reads every weight of the model; on a CPU, or any memory-bound device,
scoring K + 1 tokens in one forward costs little more than scoring one. So a cheap proposer
guesses K tokens, and the model (the *target*) scores them all in one forward:

    tokens so far   x_0 .. x_{t-1}          (the target's KV cache holds x_0 .. x_{t-2})
    drafts          d_1 .. d_K              (a draft model, or text copied from the prompt)
    verify          logits = target([x_{t-1}, d_1, .., d_K])      (1, K + 1, vocab)
                    p_i    = argmax logits[:, i]                  i = 0 .. K
    accept          n = the largest n with d_i = p_{i-1} for every i <= n
    keep            d_1 .. d_n, then p_n (the target's own next token: never wasted)
    roll back       both KV caches to the tokens kept (``KVCache.truncate``)

Every token kept is the target's argmax after exactly the tokens before it, so the output is
greedy :func:`~attnlab.generation.decode.generate`'s, token for token, up to float
rounding (see below); a step yields between 1 and K + 1 tokens for one target forward.

Two proposers:

- :func:`speculative_generate`: a smaller *draft* model with the same vocabulary decodes K
  tokens greedily, one at a time, with its own KV cache (Leviathan et al. 2023 and Chen et
  al. 2023, at temperature 0).
- :func:`prompt_lookup_generate`: no second model. The last n tokens (n = ``max_ngram`` down
  to 1) are looked up in the text so far (prompt and output); the up-to-K tokens that followed
  their most recent earlier occurrence are the guess (Saxena's prompt lookup decoding). It
  pays off when the output copies the prompt: summaries, edits, code, quotations.

Limits: one sequence (batch 1) and greedy only. The caches never roll (a sliding window is
decoded with the growing cache and the band mask, since a rolling cache cannot forget
overwritten slots), so prompt + output must fit the models' context: nanoGPT's crop, which
``generate`` applies past it, would recompute everything every step anyway. Float rounding:
the target scores K + 1 positions in one matrix product where ``generate`` scores one, so
its logits differ in the last bits and two nearly tied tokens may swap; in fp32 that is rare
(never seen in the tests), in bf16 more frequent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.cpu.prepare import decoding_kernels_
from attnlab.errors import BadInput
from attnlab.generation.decode import check_decoding


@dataclass
class Speculation:
    """What a speculative run produced: ``ids (1, prompt_len + new)`` as ``generate`` returns
    them, and its counts: tokens ``drafted`` (proposed to the target), ``accepted`` (drafts the
    target agreed with), ``target_forwards`` (the prompt's included) and ``draft_forwards``."""

    ids: Tensor
    drafted: int = 0
    accepted: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0

    @property
    def acceptance(self) -> float:
        """The share of drafted tokens the target accepted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        """``speculative: drafted 120, accepted 96 (80%), 31 target forwards``."""
        return (f"speculative: drafted {self.drafted}, accepted {self.accepted} "
                f"({self.acceptance:.0%}), {self.target_forwards} target forwards")


def check_speculative(target: nn.Module, prompt_len: int, max_new_tokens: int,
                      draft_tokens: int, draft: nn.Module | None = None) -> None:
    """One-line :class:`BadInput` for what speculative decoding cannot do: ``draft_tokens``
    < 1, a draft with another vocabulary size, or prompt + output longer than a model's
    context (the last token is never fed, so ``prompt_len + max_new_tokens − 1`` positions)."""
    if draft_tokens < 1:
        raise BadInput(f"draft_tokens must be >= 1, got {draft_tokens}")
    models = [("the model", target)]
    if draft is not None:
        models.append(("the draft model", draft))
        mine, theirs = target.config.vocab_size, draft.config.vocab_size
        if mine != theirs:
            raise BadInput(f"the draft model's vocabulary has {theirs} tokens, the model's "
                           f"{mine}: a draft must share the model's tokenizer")
    needed = prompt_len + max_new_tokens - 1
    for name, model in models:
        context = model.config.context
        if context is not None and needed > context:
            raise BadInput(
                f"speculative decoding does not crop the context: a prompt of {prompt_len} "
                f"tokens and {max_new_tokens} new tokens need {needed} positions, more than "
                f"{name}'s context of {context}; ask for at most "
                f"{max(context - prompt_len + 1, 0)} new tokens, or decode without drafts")


def _logits(model: nn.Module, step: Tensor, cache, n: int) -> Tensor:
    """The fp32 logits ``(n, vocab)`` of the last ``n`` of ``step (1, seq)``'s positions, fed
    after ``cache``: only those are projected onto the vocabulary (a long prompt's other
    positions would cost a vocabulary-sized matrix product each)."""
    return model.lm_head(model.features(step, cache=cache)[0, -n:]).float()


class _DraftModel:
    """Proposes by decoding greedily with a draft model and its own KV cache, which holds a
    prefix of the text: the tokens it has not seen yet are fed first, in one forward."""

    def __init__(self, model: nn.Module, capacity: int, eos_id: int | None):
        self.model, self.eos_id, self.forwards = model, eos_id, 0
        self.cache = model.new_cache(capacity=capacity, rolling=False)

    def propose(self, out: Tensor, length: int, k: int) -> list[int]:
        """Up to ``k`` greedy tokens after ``out[:, :length]``; stops after an eos."""
        drafts: list[int] = []
        step = out[:, self.cache.length : length]
        while len(drafts) < k:
            token = int(_logits(self.model, step, self.cache, 1).argmax())
            self.forwards += 1
            drafts.append(token)
            if token == self.eos_id:  # the target stops there too, if it agrees
                break
            step = step.new_tensor([[token]])
        return drafts

    def keep(self, length: int) -> None:
        """Only the first ``length`` tokens of the text are final: drop later cache entries
        (drafts the target rejected)."""
        self.cache.truncate(min(self.cache.length, length))


class _PromptLookup:
    """Proposes the tokens that followed the most recent earlier occurrence of the text's last
    n tokens, trying n = ``max_ngram`` down to 1."""

    forwards = 0

    def __init__(self, max_ngram: int):
        if max_ngram < 1:
            raise BadInput(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram

    def propose(self, out: Tensor, length: int, k: int) -> list[int]:
        if k == 0:
            return []
        text = out[0, :length]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            # windows[i] = text[i : i + n]; the last window is the n-gram itself, and an
            # occurrence must be followed by at least one token: starts 0 .. length − n − 1
            windows = text.unfold(0, n, 1)[: length - n]
            starts = (windows == text[length - n :]).all(-1).nonzero()
            if len(starts):
                begin = int(starts[-1]) + n
                return text[begin : begin + k].tolist()
        return []

    def keep(self, length: int) -> None:
        pass


@torch.no_grad()
def _speculate(target: nn.Module, proposer, ids: Tensor, max_new_tokens: int,
               draft_tokens: int, eos_id: int | None, on_token) -> Speculation:
    """The loop of the module docstring, for a proposer with ``propose(out, length, k)`` and
    ``keep(length)``."""
    decoding_kernels_(target).eval()  # on the CPU kernels, as in generate
    prompt_len = ids.shape[1]
    total = prompt_len + max_new_tokens
    out = ids.new_empty(1, total)  # filled in place, as in generate
    out[:, :prompt_len] = ids
    result = Speculation(ids)
    if max_new_tokens == 0:
        return result
    cache = target.new_cache(capacity=total, rolling=False)  # rollback needs a growing cache
    step = ids  # what the target has not seen yet: the prompt, then [x_{t-1}, drafts]
    length = prompt_len
    drafts: list[int] = []
    while True:
        picks = _logits(target, step, cache, len(drafts) + 1).argmax(-1).tolist()
        result.target_forwards += 1
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == picks[accepted]:
            accepted += 1
        result.drafted += len(drafts)
        result.accepted += accepted
        new = picks[: accepted + 1]  # d_1 .. d_n, then the target's own p_n
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out[0, length : length + len(new)] = out.new_tensor(new)
        length += len(new)
        cache.truncate(length - 1)  # keys of the kept tokens but the last, never fed yet
        proposer.keep(length - 1)
        if on_token is not None and on_token(out[:, prompt_len:length]):
            break
        left = total - length
        if left == 0 or new[-1] == eos_id:
            break
        # k + 1 tokens at most come back: never draft past max_new_tokens
        drafts = proposer.propose(out, length, min(draft_tokens, left - 1))
        step = torch.cat([out[:, length - 1 : length], out.new_tensor([drafts])], 1)
    result.ids = out[:, :length]
    result.draft_forwards = proposer.forwards
    return result


def _check(target: nn.Module, ids: Tensor, max_new_tokens: int, draft_tokens: int,
           draft: nn.Module | None = None) -> None:
    check_decoding(ids, max_new_tokens, 0.0, None, None, 1.0)
    if ids.shape[0] != 1:
        raise BadInput(f"speculative decoding runs one sequence, got a batch of {ids.shape[0]}")
    check_speculative(target, ids.shape[1], max_new_tokens, draft_tokens, draft)


def speculative_generate(target: nn.Module, draft: nn.Module, ids: Tensor,
                         max_new_tokens: int, draft_tokens: int = 4, eos_id: int | None = None,
                         on_token=None) -> Speculation:
    """Greedy ``generate(target, ids, max_new_tokens, eos_id=eos_id)``, with ``draft`` (a
    smaller model of the same vocabulary) guessing ``draft_tokens`` tokens a step.

    ``ids (1, prompt_len)``; the result's ``ids (1, prompt_len + new)`` stop after ``eos_id``
    or at ``max_new_tokens``. ``on_token(new)`` is called with the ``(1, n_new)`` tokens so
    far after each target forward (one or more new tokens); returning True stops. Both models
    as :func:`attnlab.cpu.for_decoding` prepares them, on one device."""
    _check(target, ids, max_new_tokens, draft_tokens, draft)
    decoding_kernels_(draft).eval()
    proposer = _DraftModel(draft, ids.shape[1] + max_new_tokens, eos_id)
    return _speculate(target, proposer, ids, max_new_tokens, draft_tokens, eos_id, on_token)


def prompt_lookup_generate(target: nn.Module, ids: Tensor, max_new_tokens: int,
                           draft_tokens: int = 10, max_ngram: int = 3,
                           eos_id: int | None = None, on_token=None) -> Speculation:
    """Greedy ``generate(target, ids, max_new_tokens, eos_id=eos_id)``, guessing up to
    ``draft_tokens`` tokens a step by copying what followed the last ``max_ngram`` (down to 1)
    tokens earlier in the prompt or the output. Arguments and result as
    :func:`speculative_generate`."""
    _check(target, ids, max_new_tokens, draft_tokens)
    proposer = _PromptLookup(max_ngram)
    return _speculate(target, proposer, ids, max_new_tokens, draft_tokens, eos_id, on_token)


__all__ = ["Speculation", "check_speculative", "speculative_generate", "prompt_lookup_generate"]
