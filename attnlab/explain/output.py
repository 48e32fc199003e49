"""The output stage: from the last layer's hidden state to the next token, checked.

For every model that predicts tokens, at the position it predicts from (a decoder-only
model's last position, the encoder–decoder's last target position, a masked LM's [MASK]):

    h            the last layer's output at that position                      (d_model,)
    Norm_f(h)    the stack's final norm, where the model has one (pre-LN)      (d_model,)
    logits       Norm_f(h) · W_Uᵀ (+ b)     (BERT: LN(act(W_t·h + b_t)) · Eᵀ + b) (vocab,)
    z            logits / T                 (T > 0: sampling; T = 0: greedy, shown at T = 1)
    filtered     top-k / top-p: the logits outside set to −inf
    p            softmax(z) = exp(z − max z) / Σ exp(z − max z)
    y            argmax p (greedy), or a draw from p with the seeded generator

The final norm and the head come from :func:`attnlab.explain.readout.readout`, and the
filtering and the choice are generation's own (:func:`attnlab.generation.decode.filter_logits`,
:func:`~attnlab.generation.decode.next_tokens`); the norm, the products and the softmax are
written out here and checked against them and against the model's own logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.explain.readout import readout
from attnlab.explain.subject import piece
from attnlab.explain.sublayers import Check, Stage, _activate, diff, norm_by_hand
from attnlab.explain.walkthrough import Walkthrough
from attnlab.generation.decode import check_decoding, filter_logits, next_tokens

TOP = 10  # candidates in the table


@dataclass(frozen=True)
class Choice:
    """How the next token is chosen: greedy (``temperature`` 0) or sampled from
    softmax(filter(logits / T)) with ``top_k``/``top_p`` and a generator seeded by ``seed``."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check_decoding(torch.ones(1, 1, dtype=torch.long), 0, self.temperature, self.top_k,
                       self.top_p, 1.0)  # generate's own limits (T >= 0, k >= 1, 0 < p <= 1)
        if self.greedy:
            given = [n for n, v in (("top_k", self.top_k), ("top_p", self.top_p),
                                    ("sample_seed", self.seed)) if v is not None]
            if given:
                raise BadInput(f"{given[0]} shapes sampling: greedy decoding (temperature 0) "
                               "ignores it; give a temperature > 0 as well")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed or 0)

    def scaled(self, logits: Tensor) -> Tensor:
        """``filter(logits / T)``; greedy: the logits as they are (T = 1, nothing cut)."""
        if self.greedy:
            return logits
        return filter_logits(logits / self.temperature, self.top_k, self.top_p)

    def probabilities(self, logits: Tensor, model: nn.Module) -> Tensor:
        """The distribution the token is chosen from, by generation's own functions."""
        return self.scaled(usable(logits, model)).softmax(-1)


def usable(logits: Tensor, model: nn.Module) -> Tensor:
    """The logits a token may be chosen from: an encoder–decoder never outputs padding
    (its logit is −inf, as :func:`~attnlab.generation.seq2seq.greedy_decode` sets it)."""
    from attnlab.models import Transformer

    if not isinstance(model, Transformer):
        return logits
    return logits.index_fill(-1, torch.tensor([model.config.pad_id]), float("-inf"))


def choose(logits: Tensor, model: nn.Module, choice: Choice, generator: torch.Generator) -> int:
    """The next token from ``logits (vocab,)``: :func:`next_tokens`, as generation draws it."""
    return int(next_tokens(usable(logits, model)[None].float(), choice.temperature,
                           choice.top_k, choice.top_p, generator)[0])


def output_stages(w: Walkthrough, model: nn.Module, h: Tensor, own_logits: Tensor, where: str,
                  tok, choice: Choice, generator: torch.Generator, tol: float = 1e-5) -> int:
    """Append the output stage (module docstring) for the hidden state ``h (d_model,)`` at
    the position named ``where``; ``own_logits (vocab,)`` are the model's own there. Returns
    the chosen token, drawn with ``generator``."""
    add, check = w.stages.append, w.checks.append
    r = readout(model)
    add(Stage("output: hidden state", "h = the last layer's output at the predicting "
              "position", h[None], rows=[where]))
    x = h
    if r.norm is not None:
        x = norm_by_hand(r.norm, h)
        add(Stage("output: final norm", f"Norm_f(h) ({type(r.norm).__name__})", x[None],
                  rows=[where]))
        check(Check("output: the final norm by hand equals the model's norm",
                    diff(x, r.normed(h)), tol))
    logits = _head_by_hand(model, x)
    add(Stage("output: logits", "Norm_f(h) · W_Uᵀ" if r.norm is not None else "h · W_Uᵀ",
              logits[None], f"{' → '.join(r.parts)}; {logits.shape[-1]} scores over the "
              f"{r.vocabulary}; W_U is {'tied to E' if r.tied else 'its own, not E'}",
              rows=[where]))
    check(Check("output: the logits by hand equal the model's own", diff(logits, own_logits),
                tol * 10))  # a product over d_model, then over the vocabulary
    z = usable(logits, model)
    if not choice.greedy:
        z = z / choice.temperature
        add(Stage("output: logits / T", f"T = {choice.temperature:g}", z[None], rows=[where]))
        if choice.top_k is not None or choice.top_p is not None:
            z = filter_logits(z, choice.top_k, choice.top_p)
            kept = int(torch.isfinite(z).sum())
            add(Stage("output: top-k / top-p", f"top_k = {choice.top_k}, top_p = "
                      f"{choice.top_p}: the rest set to −inf (generate's filter_logits)",
                      None, f"{kept} candidates kept of {z.shape[-1]}"))
    e = torch.exp(z - z.max())
    p = e / e.sum()
    top = p.topk(min(TOP, int((p > 0).sum())))
    add(Stage("output: probabilities", "p = softmax(z) = exp(z − max z) / Σ exp(z − max z)"
              + ("  (greedy: shown at T = 1)" if choice.greedy else ""),
              torch.stack([top.values, logits[top.indices]], -1),
              f"the top {len(top.indices)} candidates", rows=[piece(tok, int(i))
                                                              for i in top.indices],
              cols=["p", "logit"]))
    check(Check("output: the probabilities equal softmax of the model's own logits after "
                "generate's filtering", diff(p, choice.probabilities(own_logits, model)), tol))
    check(Check("output: the probabilities sum to 1", abs(float(p.sum()) - 1), 1e-6))
    mine = torch.Generator().set_state(generator.get_state())
    by_hand = (int(p.argmax()) if choice.greedy else
               int(torch.multinomial(p.float(), 1, generator=mine)))
    chosen = choose(own_logits, model, choice, generator)
    how = "argmax p (greedy)" if choice.greedy else \
        f"a draw from p (torch.multinomial, --sample-seed {choice.seed or 0})"
    add(Stage("output: chosen token", how, [piece(tok, chosen)],
              f"id {chosen}, p = {float(p[chosen]):.4f}"))
    check(Check("output: the choice from p by hand equals generation's next_tokens",
                float(by_hand != chosen), 0.0))
    return chosen


def _head_by_hand(model: nn.Module, x: Tensor) -> Tensor:
    """The output layer written out: ``x · W_Uᵀ + b`` (T5's tied head: ``x · d^-½`` first);
    BERT's MLM head: ``LN(act(W_t·x + b_t)) · Eᵀ + b``."""
    from attnlab.models import BERT

    if isinstance(model, BERT):
        mlm = model.mlm
        t = _activate(model.config.activation, x @ mlm.dense.weight.T + mlm.dense.bias)
        return norm_by_hand(mlm.norm, t) @ mlm.weight.T + mlm.bias
    head = model.lm_head
    if getattr(model.config, "scale_tied_logits", False):
        x = x * model.config.d_model ** -0.5
    return x @ head.weight.T + (0 if head.bias is None else head.bias)


def predicting_position(subject) -> int | None:
    """Where ``subject``'s model predicts a token: a decoder-only model's last position, a
    masked LM's first [MASK]; None for a model with no output over the vocabulary there."""
    from attnlab.models import BERT, GPT

    if isinstance(subject.model, GPT):
        return subject.ids.shape[1] - 1
    if isinstance(subject.model, BERT) and subject.model.mlm is not None:
        mask_id = getattr(subject.tokenizer, "mask_id", None)
        hits = (subject.ids[0] == mask_id).nonzero()
        return int(hits[0]) if mask_id is not None and len(hits) else None
    return None


@torch.no_grad()
def predict(w: Walkthrough, choice: Choice | None = None, tol: float = 1e-5) -> int | None:
    """The output stage of a decoder-only model (its last position) or a masked LM (its
    first [MASK]) after ``w``'s layer; the chosen token, or None where the model predicts none.
    A decoder-only model's choice is checked against ``generate``'s first token."""
    from attnlab.generation.decode import generate
    from attnlab.models import GPT

    subject, choice = w.subject, choice or Choice()
    at = predicting_position(subject)
    if at is None:
        return None
    model, ids = subject.model, subject.ids
    if isinstance(model, GPT):
        own = model(ids)[0, at]
    else:
        out = model(ids, torch.zeros_like(ids), torch.ones_like(ids))
        own = (out if model.config.head == "mlm" else out[0])[0, at]
    chosen = output_stages(w, model, w.own.layer_outputs[-1][at], own, subject.tokens[at],
                           subject.tokenizer, choice, choice.generator(), tol)
    if isinstance(model, GPT):  # the first token of `attnlab generate` (fp32), same seed
        first = generate(model, ids, 1, temperature=choice.temperature, top_k=choice.top_k,
                         top_p=choice.top_p, generator=choice.generator())[0, -1]
        w.checks.append(Check(f"output: the chosen token equals generate's first token "
                              f"({piece(subject.tokenizer, int(first))!r})",
                              float(int(first) != chosen), 0.0))
    return chosen


__all__ = ["Choice", "output_stages", "predict", "choose", "piece", "predicting_position"]
