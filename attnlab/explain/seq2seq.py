"""Follow a source sentence through an encoder–decoder, to its translation, checked as it goes.

After the encoder's layer (:func:`attnlab.explain.walkthrough.walk`), the walk continues:

    memory       Norm_f(encoder's last layer output)                      (src, d_model)
    Y₀           E_tgt[ids]·√d_model + PE[pos]   (the start token and the prefix) (tgt, d_model)
    masked self-attention, add & norm     (causal: target position i sees j ≤ i)
    cross-attention, add & norm           Q from the decoder, K and V from the memory  (tgt, src)
    feed-forward, add & norm              the decoder layer's output
    output       Norm_f(h_last)·W_Uᵀ → softmax → the next token       (:mod:`.output`)
    steps        one token a step with the KV cache, each checked against the full pass
    teacher forcing (with a target): the whole target in one causal pass equals the steps

The decoder's layer is recomputed by hand with the same functions as the encoder's
(:mod:`attnlab.explain.sublayers`), and checked against the model's own pass, recorded by
forward hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.explain.output import (
    Choice,
    choose,
    output_stages,
    piece,
    predict,
    predicting_position,
)
from attnlab.explain.subject import OwnRun, Subject, record_run
from attnlab.explain.sublayers import attention_stages, ffn_stages, residual_stage
from attnlab.explain.walkthrough import Check, Stage, Walkthrough, diff, walk
from attnlab.models import Transformer


def decoder_input(model: Transformer, tgt_tok, target: str | None) -> Tensor:
    """The decoder's input ids ``(1, t)``: the start token (``config.bos_id``) followed by the
    target prefix's tokens (no end token: the prefix is continued, not finished)."""
    ids = [model.config.bos_id] + (tgt_tok.encode(target) if target else [])
    model.config.check_length(len(ids), "target sequence")
    return torch.tensor([ids])


@dataclass
class Translation:
    """How the walk ended: the tokens built one step at a time, and translate's own answer."""

    tokens: list[int]  # bos, the prefix, then the chosen tokens (eos included when reached)
    text: str  # the target tokenizer's reading of them
    translate_text: str | None  # what generation.seq2seq.translate gives (greedy, no prefix)
    pieces: list[str] = field(default_factory=list)  # the chosen tokens, as pieces


@dataclass
class DecoderRun:
    """The decoder's own pass (need_weights), per layer, batch index dropped."""

    own: OwnRun  # layer inputs/outputs, self-attention outputs and weights
    cross_outputs: list[Tensor] = field(default_factory=list)  # (tgt, d_model)
    cross_weights: list[Tensor] = field(default_factory=list)  # (heads, tgt, src)
    logits: Tensor | None = None  # (tgt, vocab)
    memory: Tensor | None = None  # (1, src, d_model): what the cross-attention read


def record_decoder(model: Transformer, tgt: Tensor, memory: Tensor, src_mask: Tensor
                   ) -> DecoderRun:
    """The model's own ``decode`` of ``tgt`` against ``memory``, recorded by forward hooks."""
    run = DecoderRun(OwnRun(), memory=memory)

    def record_cross(module, args, out) -> None:  # out = (output, weights)
        run.cross_outputs.append(out[0][0].detach())
        run.cross_weights.append(out[1][0].detach())

    def forward() -> None:
        run.logits = model.decode(tgt, memory, src_mask, need_weights=True)[0]

    hooks = [layer.cross_attn.register_forward_hook(record_cross)
             for layer in model.decoder.layers]
    try:
        record_run(model.decoder.layers, forward, run.own)
    finally:
        for h in hooks:
            h.remove()
    return run


def walk_seq2seq(subject: Subject, tgt_tok, layer: int = 0, head: int = 0,
                 target: str | None = None, steps: int | None = None,
                 choice: Choice | None = None, tol: float = 1e-5
                 ) -> tuple[Walkthrough, Translation]:
    """The encoder's ``layer``/``head`` (as :func:`walk`), then the memory, the decoder's
    ``layer``/``head`` on the start token and ``target``, the output stage, ``steps`` more
    tokens with the KV cache (None: to the end token or the length limit) and, with a target,
    teacher forcing. Returns the walkthrough and the translation built on the way."""
    model: Transformer = subject.model
    if not isinstance(model, Transformer):
        raise BadInput(f"a {type(model).__name__} has no encoder–decoder to follow")
    if steps is not None and steps < 0:
        raise BadInput(f"--steps must be >= 0, got {steps}")
    choice = choice or Choice()
    w = walk(subject, layer, head, tol)  # (a layer or head the encoder lacks is named first)
    n_dec = len(model.decoder.layers)
    if not 0 <= layer < n_dec:
        raise BadInput(f"--layer {layer}: the decoder has layers 0..{n_dec - 1}")
    add, check = w.stages.append, w.checks.append
    src, src_toks = subject.ids, subject.tokens
    tgt = decoder_input(model, tgt_tok, target)
    tgt_toks = [piece(tgt_tok, int(i)) for i in tgt[0]]
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        last = w.own.layer_outputs[-1]
        norm = model.encoder.norm
        by_hand = last if isinstance(norm, nn.Identity) else norm(last)
        add(Stage("memory", "the encoder's output: its last layer's"
                  + ("" if isinstance(norm, nn.Identity) else ", then its final norm"),
                  by_hand, "what every decoder layer's cross-attention reads K and V from",
                  rows=src_toks))
        check(Check("the memory equals the model's own encode()", diff(by_hand, memory[0]), tol))
        run = record_decoder(model, tgt, memory, src_mask)
        _decoder_stages(w, model, run, tgt, tgt_toks, src_toks, src_mask, tol)
        generator = choice.generator()
        first = output_stages(w, model, run.own.layer_outputs[-1][-1], run.logits[-1],
                              tgt_toks[-1], tgt_tok, choice, generator, tol)
        translation = _continue(w, model, tgt_tok, src, memory, src_mask, tgt, first,
                                steps, choice, generator, tol)
        if target:
            _teacher_forcing(w, model, tgt, tgt_toks, memory, src_mask, tgt_tok, tol)
    return w, translation


def _decoder_stages(w: Walkthrough, model: Transformer, run: DecoderRun, tgt: Tensor,
                    tgt_toks: list[str], src_toks: list[str], src_mask: Tensor,
                    tol: float) -> None:
    """Decoder layer ``w.layer``, head ``w.head``: embeddings, masked self-attention,
    cross-attention and the feed-forward, each sublayer with its residual and norm."""
    add, check = w.stages.append, w.checks.append
    layer, own = w.layer, run.own
    block = model.decoder.layers[layer]
    t = tgt.shape[1]
    positions = torch.arange(t)
    positional = model.decoder_positional
    tok_emb = model.tgt_embed(tgt)[0]
    pos = positional.embed(torch.zeros_like(tok_emb)[None], positions)[0]
    scaled = " · √d_model" if model.config.scale_embeddings else ""
    add(Stage("decoder: target tokens", "the start token, then the target prefix", tgt_toks))
    add(Stage("decoder: token embeddings", f"E_tgt[ids]{scaled}", tok_emb, rows=tgt_toks))
    add(Stage("decoder: positional encodings", f"{model.config.positional} positions", pos,
              rows=tgt_toks))
    y0 = tok_emb + pos
    add(Stage("decoder: sum", f"Y₀ = E_tgt[ids]{scaled} + P[pos]", y0, rows=tgt_toks))
    check(Check("Y₀ by hand equals the input the decoder's first layer received",
                diff(y0, own.layer_inputs[0]), tol))
    y = own.layer_inputs[layer]
    if layer > 0:
        add(Stage(f"decoder: input of layer {layer}", f"output of decoder layer {layer - 1}",
                  y, rows=tgt_toks))
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    sub = block.attn_sublayer
    attn_out = attention_stages(
        w, block.self_attn, sub.norm(y) if sub.pre_norm else y, None, causal, "masked self-"
        "attention", rows=tgt_toks, cols=tgt_toks, positional=positional, positions=positions,
        mask_note="causal: target position i may attend j <= i (the triangle)",
        own_weights=own.weights[layer], own_output=own.attention_outputs[layer], tol=tol,
        x_name="Norm(Y)" if sub.pre_norm else "Y")
    y1 = residual_stage(w, sub, y, attn_out, "decoder: add & norm (1)", tgt_toks)
    sub = block.cross_sublayer
    cross_mask = src_mask[0, 0].expand(t, -1)  # (tgt, src): the source padding mask
    cross_out = attention_stages(
        w, block.cross_attn, sub.norm(y1) if sub.pre_norm else y1, run.memory[0],
        cross_mask, "cross-attention", rows=tgt_toks, cols=src_toks,
        mask_note="the source padding mask: True at real source tokens",
        own_weights=run.cross_weights[layer], own_output=run.cross_outputs[layer], tol=tol,
        x_name="Norm(Y₁)" if sub.pre_norm else "Y₁", kv_name="memory", kind="cross-attention")
    y2 = residual_stage(w, sub, y1, cross_out, "decoder: add & norm (2)", tgt_toks)
    sub = block.ffn_sublayer
    ffn_out = ffn_stages(w, block.ffn, sub.norm(y2) if sub.pre_norm else y2, "decoder",
                         tgt_toks)
    out = residual_stage(w, sub, y2, ffn_out, f"decoder: layer {layer}'s output", tgt_toks)
    check(Check(f"decoder layer {layer}'s output by hand equals the model's own pass",
                diff(out, own.layer_outputs[layer]), tol))


def _continue(w: Walkthrough, model: Transformer, tgt_tok, src: Tensor, memory: Tensor,
              src_mask: Tensor, tgt: Tensor, first: int, steps: int | None, choice: Choice,
              generator: torch.Generator, tol: float) -> Translation:
    """Generation continued one token a step with the KV cache, from the output stage's
    ``first`` token, each step's logits checked against the full recomputation."""
    from attnlab.generation.seq2seq import translate

    cfg = model.config
    limit = min(src.shape[1] + 50, cfg.max_len)  # greedy_decode's own limit, bos included
    if steps is not None:
        limit = min(limit, tgt.shape[1] + steps)
    tokens = tgt[0].tolist()
    cache = model.new_cache(capacity=cfg.max_len)
    logits = model.decode(tgt, memory, src_mask, cache=cache)[0, -1]  # the prefix, cached
    rows, table, chosen = [], [], []
    token = first
    while len(tokens) < limit:
        if chosen:  # the output stage chose the first token; each later one is chosen here
            token = choose(logits, model, choice, generator)
        full = model.decode(torch.tensor([tokens]), memory, src_mask)[0, -1]
        n = len(chosen) + 1
        probs = choice.probabilities(logits, model)
        word = piece(tgt_tok, token)
        rows.append(f"{n}: {word}")
        table.append([float(probs[token]), diff(logits, full)])
        # float32 sums in another order: the tolerance scales with the logits' size
        w.checks.append(Check(f"step {n} ({word!r}): the cached step's logits equal the "
                              "full recomputation", diff(logits, full),
                              tol * max(1.0, float(full.abs().max()))))
        tokens.append(token)
        chosen.append(word)
        if token == cfg.eos_id or len(tokens) >= limit:
            break
        logits = model.decode(torch.tensor([[token]]), memory, src_mask, cache=cache)[0, -1]
    w.stages.append(Stage(
        "generation, step by step", "y_t = " + ("argmax p" if choice.greedy else
                                                "a sample of p") + "(· | y_<t, x), KV cache",
        torch.tensor(table) if table else None,
        f"{len(chosen)} steps; each feeds only the newest token, the cache holds the rest; "
        "|Δ| cache: max |cached − full recomputation| of the logits",
        rows=rows, cols=["p", "|Δ| cache"]))
    text = tgt_tok.decode(tokens)
    done = Translation(tokens, text, None, chosen)
    w.stages.append(Stage("the translation, token by token", "the target tokenizer's reading "
                          "of the tokens chosen", chosen, repr(text)))
    if choice.greedy and tgt.shape[1] == 1 and steps is None:
        # the same source through the function `attnlab translate` calls
        done.translate_text = translate(model, w.subject.tokenizer, tgt_tok,
                                        [w.subject.sentence])[0]
        w.checks.append(Check(f"the translation equals translate's {done.translate_text!r}",
                              float(text != done.translate_text), 0.0))
    return done


def _teacher_forcing(w: Walkthrough, model: Transformer, tgt: Tensor, tgt_toks: list[str],
                     memory: Tensor, src_mask: Tensor, tgt_tok, tol: float) -> None:
    """The whole target in one pass under the causal mask (training), against one token a
    step with the cache (inference): position t's logits are the same."""
    forced = model.decode(tgt, memory, src_mask)[0]  # (t, vocab)
    cache = model.new_cache(capacity=tgt.shape[1])
    stepped = torch.stack([model.decode(tgt[:, i : i + 1], memory, src_mask, cache=cache)[0, -1]
                           for i in range(tgt.shape[1])])
    nxt = tgt[0, 1:].tolist()
    probs = forced.softmax(-1)
    table = [[float(probs[i, j]), float(probs[i].max())] for i, j in enumerate(nxt)]
    if table:
        w.stages.append(Stage(
            "teacher forcing", "the whole target in one pass, causal: logits[t] predict "
            "y_{t+1}", torch.tensor(table),
            "training reads p(the next target token) at every position at once",
            rows=[f"{a} → {piece(tgt_tok, b)}" for a, b in zip(tgt_toks, nxt, strict=False)],
            cols=["p(next)", "max p"]))
    w.checks.append(Check("teacher forcing: each position's logits equal step-by-step "
                          "decoding's", diff(forced, stepped), tol))


def check_options(subject: Subject, target: str | None, steps: int | None,
                  choice: Choice) -> None:
    """Refuse, in one line, options the model cannot follow: a target or steps without an
    encoder–decoder's decoder, a sampling setting where the model predicts no token."""
    model = subject.model
    what = f"{subject.label} is {_kind(model)}"
    if not isinstance(model, Transformer):
        for flag, value in (("--target", target), ("--steps", steps)):
            if value is not None:
                raise BadInput(f"{flag} is for an encoder–decoder's decoder: {what}")
        if choice != Choice() and predicting_position(subject) is None:
            raise BadInput(f"--temperature, --top-k, --top-p and --sample-seed choose a "
                           f"predicted token, and none is predicted here: {what}"
                           + (" (give a sentence with [MASK])" if _masked_lm(model) else ""))
    elif steps is not None and steps < 0:
        raise BadInput(f"--steps must be >= 0, got {steps}")


def _masked_lm(model: nn.Module) -> bool:
    return getattr(model, "mlm", None) is not None


def _kind(model: nn.Module) -> str:
    from attnlab.models import BERT, GPT

    if isinstance(model, GPT):
        return "a decoder-only model"
    if isinstance(model, BERT):
        return ("an encoder (masked LM) with no decoder" if _masked_lm(model)
                else "an encoder with no decoder and no masked-LM head")
    return f"a {type(model).__name__}"


def walk_sentence(subject: Subject, layer: int = 0, head: int = 0, target: str | None = None,
                  steps: int | None = None, choice: Choice | None = None,
                  target_tokenizer=None) -> tuple[Walkthrough, Translation | None]:
    """What ``attnlab explain SENTENCE`` follows: an encoder–decoder to its translation
    (:func:`walk_seq2seq`; ``target_tokenizer`` writes its output, by default the subject's);
    any other model through ``layer``/``head``, then its output stage where it predicts a
    token (:func:`~attnlab.explain.output.predict`)."""
    choice = choice or Choice()
    check_options(subject, target, steps, choice)
    if isinstance(subject.model, Transformer):
        return walk_seq2seq(subject, target_tokenizer or subject.tokenizer, layer, head,
                            target, steps, choice)
    w = walk(subject, layer, head)
    predict(w, choice)
    return w, None


__all__ = ["decoder_input", "walk_seq2seq", "walk_sentence", "check_options", "Translation",
           "record_decoder"]
