"""Multiple-choice questions scored by a language model (``evaluate choice``), zero- or
few-shot, built as EleutherAI's lm-evaluation-harness builds a local ``multiple_choice`` task
(``target_delimiter=" "``, ``fewshot_delimiter="\\n\\n"``, the example's ``instruction`` as the
description).

An example is one JSON line: ``context`` (str), ``choices`` (≥ 2 non-empty str), ``answer``
(the index of the right choice) and an optional ``instruction`` (str; null or "" is none).
With K demonstrations ``d_1 … d_K`` the model is asked, for each choice ``c``,

    prompt       = description ⧺ demo(d_1) ⧺ … ⧺ demo(d_K) ⧺ context
    description  = instruction ⧺ "\\n\\n"            ("" without an instruction)
    demo(d)      = d.context ⧺ " " ⧺ d.choices[d.answer] ⧺ "\\n\\n"
    continuation = " " ⧺ c

and scores ``log p(continuation | prompt)`` (:mod:`attnlab.generation.likelihood`). Then

    acc      = [argmax_c log p(c) = answer]
    acc_norm = [argmax_c log p(c) / len(c) = answer]      len in characters, of the choice alone

(argmax: the first of equal maxima, as numpy's), each averaged over the examples.

Tokenisation follows the harness's ``_encode_pair``: trailing whitespace of the prompt moves
to the front of the continuation, ``whole = encode(prompt ⧺ continuation)``,
``context = encode(prompt)`` and the continuation's tokens are ``whole[len(context):]``, with no
BOS or EOS added. An empty prompt becomes the single BOS id (the EOS id without one), unless
the continuation's first token is that id, which then becomes the context.

Demonstrations come from a pool: another file, or the other lines of the evaluated file. They
never include the scored example: neither its own line nor any line with the same content.
``seed`` given, each example draws its K at random with ``random.Random(f"{seed}:{position}")``
(its own generator: the demonstrations of one example do not depend on the others;
:meth:`DemoPool.draw`); ``seed`` None takes the first K in file order, the same for every
example (the harness's ``first_n`` sampler, which reproduces a run exactly; but where a
separate pool holds a copy of the question, the harness would show it and attnlab does not).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from torch import nn

from attnlab.errors import BadInput
from attnlab.generation.likelihood import grouped_continuation_logprobs
from attnlab.tasks.choice.data import Example
from attnlab.tokenizers import Tokenizer

TARGET_DELIMITER = " "  # between a context and its answer
FEWSHOT_DELIMITER = "\n\n"  # after each demonstration, and after the description


# --- demonstrations --------------------------------------------------------------------------
class DemoPool:
    """The examples demonstrations are drawn from, indexed by content, so that excluding the
    scored question and its copies costs no pass over the pool. ``is_data``: the pool is the
    evaluated file itself, so a question's own line (its ``position``) is excluded too."""

    def __init__(self, examples: Sequence[Example], is_data: bool = False):
        self.examples = list(examples)
        self.is_data = is_data
        self._lines: dict[Example, list[int]] = {}  # content -> the indices holding it
        for j, example in enumerate(self.examples):
            self._lines.setdefault(example, []).append(j)

    def __len__(self) -> int:
        return len(self.examples)

    def excluded(self, example: Example, position: int) -> set[int]:
        """The indices that may not demonstrate ``example``: its copies (and its own line)."""
        out = set(self._lines.get(example, ()))
        if self.is_data:
            out.add(position)
        return out

    def available(self, example: Example, position: int) -> int:
        return len(self.examples) - len(self.excluded(example, position))

    def draw(self, example: Example, position: int, shots: int,
             seed: int | None) -> list[int]:
        """``shots`` indices of the pool to demonstrate ``example`` (``position``: its index in
        the evaluated file), none excluded. With a ``seed``: ``random.Random(f"{seed}:{position}")``
        samples ``shots + e`` distinct indices (``e`` = how many are excluded) and the first
        ``shots`` not excluded are kept, a uniform draw without replacement among the others.
        Without: the first ``shots`` not excluded, in file order."""
        if shots < 0:
            raise BadInput(f"the number of demonstrations must be >= 0, got {shots}")
        skip = self.excluded(example, position)
        if shots > len(self.examples) - len(skip):
            raise BadInput(f"{shots} demonstrations asked for, but only "
                           f"{len(self.examples) - len(skip)} to draw from")
        if seed is None:
            order: Iterable[int] = range(len(self.examples))
        else:
            rng = random.Random(f"{seed}:{position}")
            order = rng.sample(range(len(self.examples)), shots + len(skip))
        return list(itertools.islice((j for j in order if j not in skip), shots))


# --- the prompt and its tokens ---------------------------------------------------------------
def build_prompt(example: Example, demos: Sequence[Example] = ()) -> str:
    """``description ⧺ demo(d_1) ⧺ … ⧺ context`` (module docstring); no trailing delimiter."""
    description = example.instruction + FEWSHOT_DELIMITER if example.instruction else ""
    shown = "".join(d.context + TARGET_DELIMITER + d.choices[d.answer] + FEWSHOT_DELIMITER
                    for d in demos)
    return description + shown + example.context


def continuations(example: Example) -> list[str]:
    """What is scored after the prompt: ``" " ⧺ choice`` for each choice."""
    return [TARGET_DELIMITER + c for c in example.choices]


def encode_pair(tokenizer: Tokenizer, context: str,
                continuation: str) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` as the harness splits them (module docstring).

    Trailing whitespace moves from the context to the continuation, so that ``"A:" + " B"``
    and ``"A: " + "B"`` tokenise alike; the continuation's ids are what encoding the whole
    adds after the context's ids. An empty context (or one of whitespace only) is the BOS id
    (else EOS), or the continuation's first token when that is the same id."""
    stripped = context.rstrip()
    if stripped:
        continuation = context[len(stripped):] + continuation
        whole = tokenizer.encode(stripped + continuation)
        context_ids = tokenizer.encode(stripped)
        if context_ids:
            return context_ids, whole[len(context_ids):]
    ids = tokenizer.encode(context + continuation)
    prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if prefix is None:
        raise BadInput("the prompt is empty and the tokenizer has neither a BOS nor an EOS "
                       "token to condition on")
    if ids and ids[0] == prefix:
        return ids[:1], ids[1:]
    return [prefix], ids


def encode_choices(tokenizer: Tokenizer, prompt: str, example: Example,
                   where: str = "") -> list[tuple[list[int], list[int]]]:
    """One ``(context_ids, continuation_ids)`` request per choice of ``example``; a choice
    that adds no token to the prompt is an error naming ``where``."""
    requests = [encode_pair(tokenizer, prompt, c) for c in continuations(example)]
    for i, (_, ids) in enumerate(requests):
        if not ids:
            at = f"{where}: " if where else ""
            raise BadInput(f"{at}choice {i} ({example.choices[i]!r}) encodes to no token "
                           "after the prompt")
    return requests


# --- scores ----------------------------------------------------------------------------------
def score_requests(model: nn.Module, requests: Sequence[Sequence[tuple[list[int], list[int]]]],
                   batch_size: int = 1) -> list[list[float]]:
    """Each question's choices' log-likelihoods, ``batch_size`` questions a forward pass
    (:func:`~attnlab.generation.likelihood.grouped_continuation_logprobs`), batched longest
    first, as lm-evaluation-harness orders its requests: questions of about the same length
    share a batch, so little of it is padding."""
    order = sorted(range(len(requests)),
                   key=lambda q: -max(len(x) + len(c) for x, c in requests[q]))
    scores: list[list[float]] = [[] for _ in requests]
    for i in range(0, len(order), batch_size):
        batch = order[i : i + batch_size]
        done = grouped_continuation_logprobs(model, [requests[q] for q in batch])
        for q, s in zip(batch, done, strict=True):
            scores[q] = s.tolist()
    return scores


def argmax(values: Sequence[float]) -> int:
    """The index of the largest value, the first of equal ones (numpy's rule)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


@dataclass(frozen=True)
class Judged:
    """One example scored: the choices' log-likelihoods and what they predict."""

    scores: tuple[float, ...]
    pred: int  # argmax of the log-likelihoods
    pred_norm: int  # argmax of the log-likelihoods per character of the choice
    answer: int

    @property
    def acc(self) -> float:
        return float(self.pred == self.answer)

    @property
    def acc_norm(self) -> float:
        return float(self.pred_norm == self.answer)


def judge(example: Example, scores: Sequence[float]) -> Judged:
    """``acc`` and ``acc_norm`` of one example from its choices' log-likelihoods, as the
    harness's ``process_results`` computes them (``len`` of the choice, not of ``" " + c``)."""
    if len(scores) != len(example.choices):
        raise BadInput(f"{len(scores)} scores for {len(example.choices)} choices")
    scores = tuple(float(s) for s in scores)
    per_char = [s / len(c) for s, c in zip(scores, example.choices, strict=True)]
    return Judged(scores, argmax(scores), argmax(per_char), example.answer)


def mean_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the harness's standard error of it, ``sample std (n − 1) / √n`` (None
    for a single value)."""
    n = len(values)
    if n == 0:
        raise BadInput("no values to average")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


__all__ = ["DemoPool", "build_prompt",
           "continuations", "encode_pair", "encode_choices", "score_requests", "argmax",
           "Judged", "judge", "mean_stderr", "TARGET_DELIMITER", "FEWSHOT_DELIMITER"]
