"""What the HTML page shows (:mod:`attnlab.explain.html`), gathered as plain JSON-ready data.

    views      every attention the model ran, each as (layers, heads, rows, cols) weights from
               the model's own pass: the encoder's self-attention (or a decoder-only model's
               masked self-attention), and for an encoder–decoder the decoder's masked
               self-attention (target × target) and its cross-attention (target × source)
    output     the output stage's top candidates (p, logit) and the chosen token
    lens       the logit lens (:func:`~attnlab.explain.lens.logit_lens`): the top token and its
               probability, layer × read position
    ablation   each head ablated alone (:func:`~attnlab.explain.interventions.ablate_each`):
               p(the model's pick) at the last read position, layer × head

A part the model cannot give (no output layer, too many heads to ablate) is a ``{"note": …}``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import BadInput
from attnlab.explain.walkthrough import Walkthrough

MAX_ABLATED = 400  # heads (all layers and attentions together) beyond which no ablation table


def num(x: float) -> float | None:
    """A number for the page: 5 significant digits; None (JSON null) for NaN."""
    x = float(x)
    return None if x != x else float(f"{x:.5g}")


def nums(t: Tensor) -> list:
    """A tensor as nested lists of :func:`num`."""
    if t.dim() == 0:
        return num(t)
    return [nums(row) for row in t]


def page_data(w: Walkthrough, translation=None, target: str | None = None,
              target_tokenizer=None) -> dict:
    """Everything the page shows for walkthrough ``w`` (module docstring); ``target`` and
    ``target_tokenizer``: an encoder–decoder's target prefix and what writes it, as the walk
    had them; ``translation``: the walk's :class:`~attnlab.explain.seq2seq.Translation`."""
    probe, why = _probe(w, target, target_tokenizer)
    return {"title": w.subject.title, "label": w.subject.label, "layer": w.layer,
            "head": w.head, "views": views(w, target, target_tokenizer),
            "output": output(w, translation), "lens": lens(probe, why),
            "ablation": ablation(probe, why)}


def views(w: Walkthrough, target: str | None = None, target_tokenizer=None,
          lists: bool = True) -> list[dict]:
    """The attention views: the walked stack's self-attention, then an encoder–decoder's
    decoder and cross-attention, from the decoder's own pass on the start token and
    ``target`` (:func:`~attnlab.explain.seq2seq.record_decoder`). Each view's ``weights`` are
    (layers, heads, rows, cols): nested lists of :func:`num`, or with ``lists=False`` a list
    of each layer's tensor (the live page converts only the layer it shows)."""
    from attnlab.models import GPT, Transformer

    def _view(key: str, title: str, weights: list[Tensor], rows: list[str], cols: list[str],
              note: str) -> dict:
        return {"key": key, "title": title, "rows": rows, "cols": cols, "note": note,
                "weights": [nums(layer) for layer in weights] if lists else list(weights)}

    s = w.subject
    rule = "Each row sums to 1."
    if isinstance(s.model, GPT):
        first = _view("decoder", "masked self-attention", w.own.weights, s.tokens, s.tokens,
                      "Rows: the attending token (query); columns: the attended token (key); "
                      "causal: a token sees itself and the tokens before it. " + rule)
    else:
        first = _view("encoder", "encoder self-attention", w.own.weights, s.tokens, s.tokens,
                      "Rows: the attending token (query); columns: the attended token (key). "
                      + rule)
    if not isinstance(s.model, Transformer):
        return [first]
    from attnlab.explain.output import piece
    from attnlab.explain.seq2seq import decoder_input, record_decoder

    model, tgt_tok = s.model, target_tokenizer or s.tokenizer
    tgt = decoder_input(model, tgt_tok, target)
    with torch.no_grad():
        memory, src_mask = model.encode(s.ids)
    run = record_decoder(model, tgt, memory, src_mask)
    tgt_toks = [piece(tgt_tok, int(i)) for i in tgt[0]]
    return [first,
            _view("decoder", "decoder masked self-attention", run.own.weights, tgt_toks,
                  tgt_toks, "Rows and columns: the target tokens (the start token, then the "
                  "prefix); causal: position i sees j ≤ i. " + rule),
            _view("cross", "cross-attention", run.cross_weights, tgt_toks, s.tokens,
                  "Rows: the target tokens (queries, from the decoder); columns: the source "
                  "tokens (keys and values, from the encoder's output). " + rule)]


def output(w: Walkthrough, translation=None) -> dict:
    """The output stage's table (top candidates: p, logit) and the chosen token."""
    titles = {s.title for s in w.stages}
    if "output: probabilities" not in titles:
        return {"note": "No output stage: the model predicts no token here (an image's "
                        "class, where there is one, is in the walkthrough below)."}
    table, chosen = w.stage("output: probabilities"), w.stage("output: chosen token")
    data = {"rows": table.rows, "cols": table.cols, "values": nums(table.value),
            "formula": table.formula, "chosen": chosen.value[0],
            "how": f"{chosen.formula}; {chosen.note}"}
    if translation is not None:
        data["translation"] = translation.text
        data["translate"] = translation.translate_text
    return data


def _probe(w: Walkthrough, target: str | None, target_tokenizer):
    """The lens's and the ablations' input (:mod:`attnlab.explain.probe`): the walk's sentence
    and target, or its image; ``(None, why)`` for a model with no output layer."""
    from attnlab.explain.probe import image_probe, sentence_probe

    s = w.subject
    try:
        if hasattr(s, "image"):
            return image_probe(s.model, s.image), ""
        return sentence_probe(s.model, s.tokenizer, s.sentence, target, target_tokenizer), ""
    except BadInput as e:
        return None, str(e)


def lens(probe, why: str = "") -> dict:
    """The logit lens as a table: layer × read position, the top token and its probability."""
    from attnlab.explain.lens import logit_lens

    if probe is None:
        return {"note": f"No logit lens: {why}."}
    seen = logit_lens(probe, k=1)
    text = probe.token_text
    return {"layers": seen.layers, "cols": [probe.tokens[p] for p in probe.read],
            "tokens": [[text(int(i)) for i in layer[:, 0]] for layer in seen.top_ids],
            "p": nums(seen.top_probs[..., 0]), "parts": seen.parts,
            "final": [text(int(i)) for i in seen.final_ids],
            "check": {"name": seen.check.name, "error": num(seen.check.error),
                      "ok": seen.check.ok}}


def ablation(probe, why: str = "", limit: int = MAX_ABLATED) -> dict:
    """p(the model's pick) with each head ablated alone, layer × head, and unablated."""
    from attnlab.explain.hooks import stacks
    from attnlab.explain.interventions import ablate_each, attentions

    if probe is None:
        return {"note": f"No ablation table: {why}."}
    found = stacks(probe.model)
    n = sum(getattr(found[s][i], a).n_heads for s, i, a in attentions(probe.model))
    if n > limit:
        return {"note": f"No ablation table: the model has {n} heads, more than the {limit} "
                        "this page ablates one at a time (explain --ablate L.H ablates any)."}
    each = ablate_each(probe)
    return {"rows": each.rows, "cols": [f"h{h}" for h in range(each.probs.shape[1])],
            "p": nums(each.probs), "before": num(each.before),
            "chosen": probe.token_text(each.chosen), "where": probe.tokens[probe.last]}


__all__ = ["MAX_ABLATED", "ablation", "lens", "output", "page_data", "views"]
