"""One decoding pipeline for ``generate``, ``chat`` and ``serve``: built once from a loaded
decoder-only model and the decoding options, then used for every prompt.

    prepare   the device and precision, the model on the CPU engine (``attnlab.cpu``),
              the compiled one-token step if asked
    check     the prompt and the sampling settings, before anything is printed
    decode    ``generate`` (or speculative decoding), one sampling step a token; or beam search
              (``beam`` > 1: :func:`~attnlab.generation.beam.beam_generate`, the best
              hypothesis written when the search ends)
    stream    the reply's text as it grows, held back at a partial character or stop string
              (:class:`TextStream`, :class:`StopStream`: ``serve`` sends the same pieces)
    time      the load, compile, prompt and generated rates, as llama.cpp counts them

The command-line layer parses flags into :class:`DecodingOptions` and prints what this returns;
nothing here knows about flags or reaches back into ``cli/``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TextIO

import torch
from torch import Tensor

from attnlab.errors import BadInput
from attnlab.generation.decode import check_decoding, generate

if TYPE_CHECKING:
    from attnlab.storage import Loaded


@dataclass(frozen=True)
class DecodingOptions:
    """What a decoding command asks for. ``precision`` None or "auto": the hardware decides;
    ``bits`` 4 or 8: integer weight matrices (on the CPU); ``rows``: sequences decoded
    together (a server's batch); ``kv_cache``: the KV cache's dtype; ``beam`` > 1: beam search
    with that many beams and the length penalty ``penalty`` of exponent ``alpha``
    (transformers' by default)."""

    device: str = "auto"
    precision: str | None = None
    bits: int | None = None
    kv_cache: str | None = None
    compile: bool = False
    rows: int = 1
    max_new_tokens: int = 100
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    beam: int = 1
    alpha: float = 1.0
    penalty: str = "average"


@dataclass(frozen=True)
class Runtime:
    """Where and in what decoding computes, and how the announce line says it."""

    device: torch.device
    precision: str
    label: str


def decoding_runtime(options: DecodingOptions) -> Runtime:
    """The device and precision of ``options``: integer weights run on the CPU (the integer
    kernels are CPU ones) in their own precision (a conflicting ``precision`` is refused)."""
    from attnlab import hardware
    from attnlab.cpu import kernels

    device_asked = options.device
    if options.bits:
        if options.precision not in (None, "auto", "bf16"):
            raise BadInput(f"int{options.bits} integer weights set their own precision "
                           f"(float32 activations), not {options.precision}")
        device_asked = "cpu" if device_asked == "auto" else device_asked
    device = hardware.pick_device(device_asked)
    precision = hardware.pick_precision(options.precision, device)
    kv = f", {options.kv_cache} KV cache" if options.kv_cache else ""
    if options.bits:
        return Runtime(device, precision, integer_label(options.bits) + kv)
    label = precision
    if device.type == "cpu" and precision != "fp32" and kernels.available():
        label = f"{precision} weights, float32 activations"  # (for_decoding)
    return Runtime(device, precision, label + kv)


def integer_label(bits: int) -> str:
    """What the announce line says of an integer model: its weights, the dtype of its float
    matrices (bfloat16 where the CPU runs it natively, else float32) and, on attnlab's CPU
    kernels, float32 activations (``for_decoding``)."""
    from attnlab.cpu import kernels
    from attnlab.nn.quantized import float_dtype

    label = integer_weights(bits, float_dtype())
    return label + (", float32 activations" if kernels.available() else "")


def integer_weights(bits: int, dtype: torch.dtype) -> str:
    """``int8 weights, bfloat16 float matrices``: a model's integer weights and the dtype its
    other matrices compute in, as the announce line says them."""
    return f"int{bits} weights, {str(dtype).removeprefix('torch.')} float matrices"


def folder_label(model, runtime: Runtime, kv_cache: str | None = None) -> str:
    """``runtime``'s label, or for a model that holds integer layers (a folder ``quantize``
    wrote): its integer weights, the dtype its float matrices compute in and the activations'
    (float32 on attnlab's CPU kernels)."""
    from attnlab.cpu import kernels
    from attnlab.nn.quantized import integer_parts

    found = integer_parts(model)
    if found is None:
        return runtime.label
    label = integer_weights(*found)
    if runtime.device.type == "cpu" and kernels.available():
        label += ", float32 activations"
    return label + (f", {kv_cache} KV cache" if kv_cache else "")


def timing_line(load_s: float, compile_s: float, prompt_tokens: int, begun: float,
                ticks: list[float]) -> str:
    """``timing: load L s | compile C s | prompt P tokens, R tokens/s | generated N tokens,
    G tokens/s``, the line the CLI prints. The prompt's rate is its tokens over the time to
    the first new token (the prompt's forward pass and that token's choice); the generated
    rate is the tokens after the first over the time they took, one forward pass each, as
    llama.cpp counts them (with one token, its own time)."""
    def rate(n: int, seconds: float) -> float:
        return n / seconds if seconds > 0 else float("inf")

    n = len(ticks)
    prompt = rate(prompt_tokens, ticks[0] - begun) if n else 0.0  # 0 new tokens: none ran
    if n > 1:  # (a compile happens between the first and second new token: not counted)
        generated = rate(n - 1, ticks[-1] - ticks[0] - compile_s)
    else:
        generated = rate(n, ticks[0] - begun) if n else 0.0
    return (f"timing: load {load_s:.2f} s | compile {compile_s:.2f} s | prompt {prompt_tokens} "
            f"tokens, {prompt:.1f} tokens/s | generated {n} tokens, {generated:.1f} tokens/s")


@dataclass
class Reply:
    """One decoded reply: its text (stops cut), when each new token was ready, and the
    seconds a compile took during it."""

    text: str
    prompt_tokens: int
    begun: float
    ticks: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    speculation: object | None = None  # speculative decoding's counts, when it ran

    def timing(self, load_s: float = 0.0) -> str:
        return timing_line(load_s, self.compile_s, self.prompt_tokens, self.begun, self.ticks)


class Decoding:
    """A loaded decoder-only model, prepared once for ``options`` (``runtime``: from
    :func:`decoding_runtime`, asked before the model loaded), and the decoding of its
    prompts. ``model``: the prepared model; ``compiled``: its compiled step, if asked."""

    def __init__(self, loaded: Loaded, options: DecodingOptions, runtime: Runtime | None = None):
        from attnlab.cpu import for_decoding

        self.options = options
        self.runtime = runtime or decoding_runtime(options)
        self.tokenizer = loaded.tokenizer
        self.path = loaded.path
        self.model = for_decoding(loaded.model, self.runtime.device, self.runtime.precision,
                                  options.bits is not None, rows=options.rows,
                                  kv_cache=options.kv_cache)
        if options.bits is None:  # a quantised folder: say its integers, and what the rest is
            self.runtime = replace(self.runtime, label=folder_label(self.model, self.runtime,
                                                                    options.kv_cache))
        self.compiled = None  # (nothing compiled, nothing imported, unless asked)
        if options.compile:
            from attnlab.generation.compiled import new_step

            self.compiled = new_step()

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def check(self, ids: list[int] | Tensor) -> None:
        """The prompt and the sampling settings, each problem a one-line ``BadInput``."""
        o = self.options
        prompt = ids if isinstance(ids, Tensor) else torch.tensor([ids])
        check_decoding(prompt, o.max_new_tokens, o.temperature, o.top_k, o.top_p,
                       o.repetition_penalty)
        if o.beam != 1:
            from attnlab.generation.beam import check_beam, check_beam_generate

            check_beam(o.beam, o.alpha, o.penalty)
            check_beam_generate(self.model.config, prompt.shape[1], o.max_new_tokens)

    def decode(self, ids: list[int], stops: list[str] = (), stop_ids: list[int] = (),
               eos_id: int | None = None, generator: torch.Generator | None = None,
               out: TextIO | None = None, skip_special: bool = True, draft=None,
               prompt_lookup: bool = False, draft_tokens: int = 4,
               lookup_ngram: int = 3) -> Reply:
        """Decode ``ids`` and write the reply's text to ``out`` (stdout) as it grows, stopping
        at ``eos_id``, a stop string or a stop token. ``draft`` (a prepared model) or
        ``prompt_lookup``: greedy speculative decoding, the same text."""
        o = self.options
        stream = StopStream(self.tokenizer, stops, stop_ids, out=out or sys.stdout,
                            skip_special=skip_special)
        compiled_before = 0.0 if self.compiled is None else self.compiled.compile_seconds
        prompt = torch.tensor([ids], device=self.device)
        begun = time.perf_counter()
        speculation = None
        if draft is not None or prompt_lookup:
            from attnlab.generation.speculative import (
                prompt_lookup_generate,
                speculative_generate,
            )

            def chunk(new_ids) -> bool:  # several tokens a step: fed one by one, as plain
                for n in range(len(stream.ticks) + 1, new_ids.shape[1] + 1):  # decoding does
                    if stream(new_ids[:, :n]):
                        return True
                return False

            if draft is None:
                speculation = prompt_lookup_generate(self.model, prompt, o.max_new_tokens,
                                                     draft_tokens, lookup_ngram, eos_id=eos_id,
                                                     on_token=chunk)
            else:
                speculation = speculative_generate(self.model, draft, prompt, o.max_new_tokens,
                                                   draft_tokens, eos_id=eos_id, on_token=chunk)
        elif o.beam != 1:
            self._beam(prompt, eos_id, stream)
        else:
            try:
                generate(self.model, prompt, o.max_new_tokens, temperature=o.temperature,
                         top_k=o.top_k, top_p=o.top_p, repetition_penalty=o.repetition_penalty,
                         eos_id=eos_id, generator=generator, on_token=stream,
                         compiled=self.compiled)
            except KeyboardInterrupt:  # the reply so far stands (written); the caller says so
                text = stream.finish()
                raise Interrupted(Reply(text, len(ids), begun, stream.ticks,
                                        self._compiled_since(compiled_before))) from None
        text = stream.finish()
        return Reply(text, len(ids), begun, stream.ticks, self._compiled_since(compiled_before),
                     speculation)

    def _beam(self, prompt: Tensor, eos_id: int | None, stream: StopStream) -> None:
        """Beam search: no text until the search ends (any hypothesis may still win), then the
        best one, to its eos, at once; ``stream.ticks`` holds when each step ended."""
        from attnlab.generation.beam import beam_generate

        o, ticks = self.options, []
        out = beam_generate(self.model, prompt, o.max_new_tokens, o.beam, o.alpha, o.penalty,
                            eos_id=eos_id, on_step=lambda: ticks.append(time.perf_counter()))
        new = out[:, prompt.shape[1]:]
        if eos_id is not None and bool((new == eos_id).any()):
            new = new[:, : int((new[0] == eos_id).int().argmax()) + 1]  # the filler after it
        stream(new)
        stream.ticks = ticks

    def _compiled_since(self, before: float) -> float:
        return 0.0 if self.compiled is None else self.compiled.compile_seconds - before


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a reply: ``reply`` holds what was decoded (and written) before it. A
    ``KeyboardInterrupt`` still: a caller that does not catch it (``generate``) stops as on any
    Ctrl-C; ``chat`` catches it and goes on with the conversation."""

    def __init__(self, reply: Reply):
        super().__init__("reply interrupted")
        self.reply = reply


# --- text, streamed ----------------------------------------------------------------------------
# Decoding yields token ids; a client wants text. Two things make the newest text provisional:
# a byte-level token may end inside a UTF-8 character (it decodes to U+FFFD until the next
# token completes it), and the text may end in the beginning of a stop string (``<|im_`` before
# ``end|>``), which must not be shown if the stop string follows. TextStream holds such an end
# back until a later token settles it and cuts the text before the first stop string; `attnlab
# serve` sends its pieces as server-sent chunks, StopStream writes them for generate and chat.

class TextStream:
    """The text of a growing list of token ids, released piece by piece. A piece is held back
    while it ends in a partial UTF-8 character (``\\ufffd``) or in what could be the start of
    a stop string; :attr:`stopped` is set (and the text cut before it) when one appears."""

    def __init__(self, decode, stops: list[str]):
        self.decode, self.stops = decode, stops
        self.ids: list[int] = []
        self.text = ""  # released so far
        self.stopped = False

    def feed(self, ids: list[int], final: bool = False) -> str:
        """Add ``ids``; the text that may be sent now (``final``: everything that is left)."""
        self.ids.extend(ids)
        if self.stopped:
            return ""
        full = self.decode(self.ids)
        hit = min((full.find(s) for s in self.stops if s in full), default=-1)
        if hit >= 0:
            self.stopped = True
            full = full[:hit]
        elif not final:
            full = full.rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, min(len(s), len(full) + 1))
                        if full.endswith(s[:k])), default=0)
            full = full[: len(full) - hold]
        if len(full) <= len(self.text) or not full.startswith(self.text):
            return ""
        piece, self.text = full[len(self.text):], full
        return piece


class StopStream:
    """``generate``'s ``on_token``: writes the text of the new tokens to ``out`` as it grows
    (a :class:`TextStream`), and stops at the first of ``stop_ids`` or ``stops`` (strings),
    neither of which is written. :meth:`finish` writes what is left and returns the reply.
    ``ticks`` holds when each new token was ready (the CLI's timing line).
    ``skip_special=False`` keeps special tokens in the text, so that a stop string such as
    ``<|eot_id|>`` is seen."""

    def __init__(self, tokenizer, stops=(), stop_ids=(), out=None, skip_special: bool = True):
        self.stream = TextStream(lambda ids: tokenizer.decode(ids, skip_special=skip_special),
                                 [s for s in stops if s])
        self.stop_ids = set(stop_ids)
        self.out = sys.stdout if out is None else out
        self.seen = 0  # tokens fed to the stream
        self.stopped = False
        self.ticks: list[float] = []

    def __call__(self, new_ids) -> bool:
        """``new_ids (1, n)``: every new token so far; True once a stop is reached."""
        self.ticks.append(time.perf_counter())
        ids = new_ids[0, self.seen:].tolist()
        self.seen = new_ids.shape[1]
        cut = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        if cut is not None:
            ids, self.stopped = ids[:cut], True
        self._write(self.stream.feed(ids, final=self.stopped))
        self.stopped |= self.stream.stopped
        return self.stopped

    def _write(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()

    def finish(self) -> str:
        """Write the rest of the reply (what was held back); return the whole reply."""
        self._write(self.stream.feed([], final=True))
        return self.stream.text


__all__ = ["Decoding", "DecodingOptions", "Interrupted", "Reply", "Runtime", "StopStream",
           "TextStream", "decoding_runtime", "folder_label", "integer_label", "integer_weights",
           "timing_line"]
