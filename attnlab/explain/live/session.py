"""The model side of ``attnlab explain --serve``: one loaded model, and what the page asks of it.

Every answer is built from the explain package's own functions, so the page shows what the
command prints and checks:

    run       the walk of one layer and head (:func:`~attnlab.explain.seq2seq.walk_sentence`,
              :func:`~attnlab.explain.image.walk_image`): its stages and checks, the attention
              of every layer and head (:func:`~attnlab.explain.page_data.views`), the output
              stage's logits, and on request heads switched off
              (:func:`~attnlab.explain.interventions.ablate`) or patched from a second sentence
              (:func:`~attnlab.explain.interventions.patch_from`)
    lens      the logit lens of a run (:func:`~attnlab.explain.page_data.lens`)
    next      the next token drawn by generation's own choice
              (:func:`~attnlab.explain.output.choose`), and the input with it appended
    html      the self-contained page ``explain --html`` writes

Input is checked before any model runs (an empty sentence, more tokens than ``max_tokens``, a
layer or head the model lacks, an image of the wrong shape): a :class:`BadInput` or
:class:`TooLong` naming the problem. The session is not thread-safe: the app runs one request
at a time.
"""

from __future__ import annotations

import base64
import itertools
import secrets
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from attnlab.errors import BadInput
from attnlab.explain.live import payload
from attnlab.explain.output import Choice, choose, usable
from attnlab.explain.page_data import nums

TOP = 50  # labelled candidates sent with the logits: the page shows the top 10 of the kept set
KEPT_RUNS = 8  # runs whose attention and probes stay for follow-up requests
CHARS_PER_TOKEN = 32  # a sentence longer than max_tokens × this is refused before tokenising


class TooLong(BadInput):
    """The input has more tokens than the server's ``--max-tokens``."""


class RunGone(BadInput):
    """A follow-up names a run the session no longer keeps."""


@dataclass
class Ask:
    """One request's input, as the page sends it."""

    sentence: str = ""
    target: str | None = None
    digit: int | None = None
    image: list | None = None
    layer: int = 0
    head: int = 0
    ablate: list[str] = field(default_factory=list)
    patch_from: str | None = None


@dataclass
class Run:
    """What a run keeps for the page's follow-up requests (another layer, a stage's values, the
    lens)."""

    views: list[dict]  # page_data.views: every layer's weights, as tensors
    walk: object  # the Walkthrough
    probe: object | None  # the lens's and the interventions' input; None: the model has none


class Session:
    """A model loaded once (``--model``, or a random tiny one), answering the page."""

    def __init__(self, spec: str | None, seed: int = 0, max_tokens: int = 128,
                 image: str | None = None, sentence: str | None = None,
                 target: str | None = None) -> None:
        """``spec``: the model (``--model``; None: a random tiny one, or with ``image`` a random
        vit-tiny); ``image``, ``sentence`` and ``target``: what the page shows first."""
        from attnlab.hardware import weights_on

        self.max_tokens = max_tokens
        self.runs: OrderedDict[str, Run] = OrderedDict()
        self._ids = itertools.count(1)
        loaded = None
        if spec is not None:
            from attnlab.storage import load

            loaded = load(spec)
        self.vision = image is not None or (loaded is not None and loaded.kind == "vision")
        if self.vision:
            from attnlab.data.images import read_image
            from attnlab.explain.image import load_image_model

            if loaded is None:
                self.model, self.label, self.source = load_image_model(None, seed)
            else:
                loaded.expect("vision", "explain --serve --image")
                self.model, self.label, self.source = loaded.model, spec, str(loaded.path)
            c = self.model.config
            self.example_image, _ = read_image(image or "digits:0", c.num_channels,
                                               c.image_size)
            self.tokenizer = self.target_tokenizer = None
            self.example = ""
        else:
            from attnlab.explain.subject import load_subject_model

            m = load_subject_model(spec, [sentence or EXAMPLE], seed, loaded)
            self.model, self.tokenizer, self.label, self.source = m[:4]
            self.target_tokenizer = m.target_tokenizer
            self.example = sentence or (MASKED_EXAMPLE if self.masked_lm else EXAMPLE)
        self.example_target = target or ""
        self.device, self.precision = weights_on(self.model)

    # --- what the page is told first --------------------------------------------------------
    @property
    def kind(self) -> str:
        from attnlab.models import GPT, Transformer

        if self.vision:
            return "vision"
        if isinstance(self.model, GPT):
            return "decoder"
        return "seq2seq" if isinstance(self.model, Transformer) else "encoder"

    @property
    def masked_lm(self) -> bool:
        return getattr(self.model, "mlm", None) is not None

    @property
    def mask_token(self) -> str:
        from attnlab.explain.subject import piece

        return piece(self.tokenizer, self.tokenizer.mask_id)

    def info(self) -> dict:
        image = None
        if self.vision:
            from attnlab.data.images import load_digits

            c = self.model.config
            image = {"size": c.image_size, "channels": c.num_channels,
                     "digits": len(load_digits().test), "example": 0}
        mask = self.mask_token if self.masked_lm else None
        return {"model": self.label, "kind": self.kind, "masked_lm": self.masked_lm,
                "mask_token": mask, "device": str(self.device), "precision": self.precision,
                "max_tokens": self.max_tokens, "example": self.example,
                "example_target": self.example_target if self.kind == "seq2seq" else None,
                "image": image}

    # --- checking the input -----------------------------------------------------------------
    def _sentence(self, text: str | None, what: str = "sentence") -> str:
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"the {what} is empty: type a few words")
        if len(text) > self.max_tokens * CHARS_PER_TOKEN:
            raise TooLong(f"the {what} has {len(text)} characters: at most "
                          f"{self.max_tokens} tokens are explained (--max-tokens)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON may carry a lone surrogate, which no text holds
            raise BadInput(f"the {what} is not valid text (a lone UTF-16 surrogate)") from None
        return text

    def _count(self, n: int, what: str = "sentence") -> None:
        if n > self.max_tokens:
            raise TooLong(f"the {what} has {n} tokens: at most {self.max_tokens} are explained "
                          "(--max-tokens)")

    def _image(self, ask: Ask) -> tuple[Tensor, str]:
        c = self.model.config
        if ask.image is None:
            from attnlab.data.images import read_image

            digit = 0 if ask.digit is None else ask.digit
            return read_image(f"digits:{digit}", c.num_channels, c.image_size)
        image = payload.image_tensor(ask.image, c.num_channels, c.image_size)
        return image, "the drawn image"

    def subject(self, ask: Ask):
        """The input through the model's embeddings (checked), ready for the walk."""
        if self.vision:
            from attnlab.explain.image import make_image_subject

            image, name = self._image(ask)
            return make_image_subject(self.model, image, name, self.label)
        from attnlab.explain.seq2seq import check_options
        from attnlab.explain.subject import make_subject

        self._count(len(self.tokenizer.encode(self._sentence(ask.sentence))))
        subject = make_subject(self.model, self.tokenizer, ask.sentence, self.label)
        if ask.target:
            self._sentence(ask.target, "target")
            self._count(len(self.target_tokenizer.encode(ask.target)) + 1, "target")
        check_options(subject, ask.target or None, None, Choice())
        return subject

    def _probe(self, ask: Ask, sentence: str | None = None):
        from attnlab.explain.probe import image_probe, sentence_probe

        if self.vision:
            return image_probe(self.model, self._image(ask)[0])
        return sentence_probe(self.model, self.tokenizer, sentence or ask.sentence,
                              ask.target or None, self.target_tokenizer)

    # --- a run ------------------------------------------------------------------------------
    def run(self, ask: Ask) -> dict:
        """The page's data for ``ask`` (the module docstring), kept as a run for follow-ups."""
        from attnlab.explain.page_data import views

        subject = self.subject(ask)
        probe, why = None, ""
        try:
            probe = self._probe(ask)
        except BadInput as e:  # no output layer (MiniLM) or no [MASK]: attention only
            why = str(e)
        if (ask.ablate or ask.patch_from) and probe is None:
            raise BadInput(f"heads are switched off and patched by their effect on the "
                           f"prediction, and here there is none: {why}")
        heads = other = None
        if ask.ablate:
            from attnlab.explain.interventions import parse_heads

            heads = parse_heads(",".join(ask.ablate), probe, "ablate")
        if ask.patch_from:
            from attnlab.explain.interventions import check_same_length

            if self.vision:
                raise BadInput("patching takes a second sentence; an image has none here")
            self._sentence(ask.patch_from, "second sentence")
            other = self._probe(ask, ask.patch_from)
            check_same_length(probe, other, "patch")
        w, translation = self._walk(subject, ask)
        all_views = views(w, ask.target or None, self.target_tokenizer, lists=False)
        run_id = str(next(self._ids))
        self.runs[run_id] = Run(all_views, w, probe)
        while len(self.runs) > KEPT_RUNS:
            self.runs.popitem(last=False)
        return {"run": run_id, "title": w.subject.title, "tokens": w.subject.tokens,
                "layer": w.layer, "head": w.head, "layers": len(w.subject.layers),
                "heads": w.subject.layers[w.layer].self_attn.n_heads,
                "views": [payload.chosen_layer(v, w.layer, self._prefix(v["key"]))
                          for v in all_views],
                "neuron": payload.neuron(w, all_views[0]["key"]),
                "stages": [payload.stage(i, s) for i, s in enumerate(w.stages)],
                "checks": [payload.check(c) for c in w.checks],
                "output": self._output(w, probe, why),
                "image": payload.image_view(w) if self.vision else None,
                "ablation": payload.ablation(probe, heads) if heads else None,
                "patching": payload.patching(probe, other) if other is not None else None,
                "translation": translation.text if translation is not None else None}

    def _walk(self, subject, ask: Ask):
        if self.vision:
            from attnlab.explain.image import walk_image

            return walk_image(subject, ask.layer, ask.head), None
        from attnlab.explain.seq2seq import walk_sentence

        return walk_sentence(subject, ask.layer, ask.head, ask.target or None, None, Choice(),
                             self.target_tokenizer)

    def _prefix(self, key: str) -> str:
        return f"{key}." if self.kind == "seq2seq" else ""

    def _output(self, w, probe, why: str) -> dict:
        """The logits a token (or a class) may be chosen from, where the walk predicts one."""
        if self.vision:
            if w.own.logits is None:
                return {"note": "The model has no classifier head: attention only."}
            logits, where, kind = w.own.logits.float(), "[CLS]", "class"
            text = probe.token_text
        else:
            titles = {s.title for s in w.stages}
            if "output: logits" not in titles:
                return {"note": "The model predicts no token here: " + (
                    why or "it has no output layer") + ". Its attention is shown."}
            stage = w.stage("output: logits")
            logits = usable(stage.value[-1].float(), self.model)
            where, kind = w.stage("output: hidden state").rows[-1], "token"
            text = probe.token_text
        top = logits.topk(min(TOP, logits.numel())).indices.tolist()
        raw = logits.numpy().astype("<f4").tobytes()
        return {"kind": kind, "where": where, "logits": base64.b64encode(raw).decode(),
                "ids": top, "texts": [text(i) for i in top], "chosen": text(top[0])}

    # --- follow-ups -------------------------------------------------------------------------
    def kept(self, run_id: str) -> Run:
        if run_id not in self.runs:
            raise RunGone(f"run {run_id!r} is gone (the server keeps the last {KEPT_RUNS}): "
                           "run the sentence again")
        return self.runs[run_id]

    def attention(self, run_id: str, view: str, layer: int) -> dict:
        run = self.kept(run_id)
        found = next((v for v in run.views if v["key"] == view), None)
        if found is None:
            raise BadInput(f"no view {view!r}; this run has "
                           f"{', '.join(v['key'] for v in run.views)}")
        if not 0 <= layer < len(found["weights"]):
            raise BadInput(f"no layer {layer}: the view has layers 0..{len(found['weights']) - 1}")
        return {"weights": nums(found["weights"][layer])}

    def stage(self, run_id: str, i: int) -> dict:
        from attnlab.explain.report import format_value

        stages = self.kept(run_id).walk.stages
        if not 0 <= i < len(stages):
            raise BadInput(f"no stage {i}: the walk has stages 0..{len(stages) - 1}")
        s = stages[i]
        if s.value is None:
            return {"text": s.note or s.formula}
        return {"text": format_value(s.value, 8, s.rows, s.cols)}

    def lens(self, run_id: str) -> dict:
        from attnlab.explain.page_data import lens

        run = self.kept(run_id)
        if run.probe is None:
            return {"note": "No logit lens: the model has no output layer to read it through."}
        return lens(run.probe)

    def next(self, ask: Ask, temperature: float, top_k: int | None, top_p: float | None,
             seed: int | None) -> dict:
        """The next token drawn as ``generate`` draws it, and the input with it appended."""
        if self.vision:
            raise BadInput("an image has no next token: the model predicts its class")
        self.subject(ask)  # the input's checks; the layer and head play no part here
        if seed is None and temperature > 0:  # a fresh seed, reported so the draw can be repeated
            seed = secrets.randbits(31)
        try:
            choice = Choice(temperature, top_k, top_p, seed)
        except BadInput as e:
            raise BadInput(str(e).replace("sample_seed", "seed")) from None
        probe = self._probe(ask)
        patches = {}
        if ask.ablate:  # the model as the page shows it: with its heads switched off
            from attnlab.explain.interventions import parse_heads, zero_heads

            patches = zero_heads(parse_heads(",".join(ask.ablate), probe, "ablate"))
        from attnlab.explain.hooks import patched

        with patched(self.model, patches):
            scores = probe.forward()
        at = 0 if self.kind == "encoder" else -1  # a masked LM fills its first [MASK]
        new = choose(scores[at].float(), self.model, choice, choice.generator())
        token = probe.token_text(new)
        sentence, target, done = ask.sentence, ask.target, False
        if self.kind == "decoder":
            sentence = ask.sentence + _appended(self.tokenizer, ask.sentence, new)
            done = new == self.model.config.eos_id
        elif self.kind == "seq2seq":
            target = (ask.target or "") + _appended(self.target_tokenizer, ask.target or "", new)
            done = new == self.model.config.eos_id
        else:
            word = self.tokenizer.decode([new]).strip()
            if word.startswith("##"):  # a word's continuation joins the word before the mask
                before, _, after = ask.sentence.partition(self.mask_token)
                sentence = before.rstrip() + word[2:] + after
            else:
                sentence = ask.sentence.replace(self.mask_token, word, 1)
        return {"id": new, "token": token, "seed": choice.seed or 0, "greedy": choice.greedy,
                "sentence": sentence, "target": target, "done": done}

    def html(self, ask: Ask) -> str:
        """The self-contained page ``explain --html`` writes, for ``ask``."""
        from attnlab.explain.html import write_html

        subject = self.subject(ask)
        w, translation = self._walk(subject, ask)
        with tempfile.TemporaryDirectory() as folder:
            path = write_html(w, Path(folder) / "page.html", None, 6, translation,
                              ask.target or None, self.target_tokenizer)
            return path.read_text(encoding="utf-8")


def _appended(tok, text: str, new: int) -> str:
    """What token ``new`` adds to ``text``: the decoded text with it, less the decoded text
    without it (the user's own text is kept as typed: a tokenizer may not give it back)."""
    ids = tok.encode(text) if text else []
    before, after = tok.decode(ids), tok.decode(ids + [new])
    return after[len(before):] if after.startswith(before) else tok.decode([new])


EXAMPLE = "The cat sat on the mat because it was"
MASKED_EXAMPLE = "The cat sat on the [MASK] because it was warm."


__all__ = ["Ask", "Session", "TooLong"]
