"""Generation for decoder-only models: the prompt is run once, then one token per step.

    prefill:  logits = model(prompt)              (fills the KV cache)
    step t:   y_t ~ p(· | y_<t)  or  argmax        (only y_{t-1} goes through the model)

Greedy by default; ``temperature`` > 0 samples from softmax(logits / T), optionally restricted
to the ``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p``.
Left-padded batches pass ``attention_mask`` (1 = real token); positions then count from each
row's first real token, as Hugging Face does.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn import cpu_kernels
from attnlab.nn.layout import KernelLinear, decoding_layout_, fuse_projections_

if TYPE_CHECKING:
    from attnlab.generation.compiled import CompiledStep


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to −inf every logit outside the top-k and outside the nucleus of mass ``top_p``."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass of the tokens before it already reaches top_p
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty: logits of tokens in ``seen (batch, n)`` are divided by
    ``penalty`` when positive and multiplied by it when negative."""
    picked = logits.gather(-1, seen)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(-1, seen, picked)


def check_decoding(ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                   top_p: float | None, repetition_penalty: float) -> None:
    """Reject settings that would otherwise be ignored silently or fail deep inside torch."""
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise BadInput(f"the prompt must be (batch, length >= 1) token ids, got shape "
                       f"{tuple(ids.shape)}")
    if max_new_tokens < 0:
        raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:  # also catches NaN
        raise BadInput(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise BadInput(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
    if not repetition_penalty > 0:
        raise BadInput(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")


@torch.no_grad()
def generate(model, ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, eos_id: int | None = None,
             generator: torch.Generator | None = None, on_token=None,
             compiled: CompiledStep | None = None) -> Tensor:
    """``ids (batch, prompt_len)`` -> ``(batch, prompt_len + new)``; stops early when every row
    has produced ``eos_id``; finished rows are padded with ``eos_id``. The model sees at most
    ``model.config.context`` tokens (its trained ``block_size``, else ``max_len``): a longer
    prompt or output is cropped to its last ``context`` tokens, at positions 0 .. context − 1,
    as nanoGPT does; generation itself may run as long as asked. ``on_token(new)`` is
    called with the ``(batch, n_new)`` tokens so far after each step (streaming); returning
    True stops generation (stop strings). On a CPU, ``decoding_layout_(model)`` first
    makes decoding faster; :func:`for_decoding` and the CLI do that.

    ``compiled``: every token after the prompt's first runs through that compiled one-token
    step against a static cache (``generation/compiled.py``), when prompt + output fit the
    model's context (past it, nanoGPT's crop needs the eager path)."""
    check_decoding(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty)
    model.eval()
    batch, prompt_len = ids.shape
    total = prompt_len + max_new_tokens
    # The context never spans more positions than the model was trained on (nanoGPT's crop):
    # once it would, each step runs the last `window` tokens again from position 0, uncached.
    window = model.config.context
    start = 0 if window is None else max(0, prompt_len - window)  # the window's first token
    use_static = compiled is not None and (window is None or total <= window)
    # (a static cache is made from a growing one: no rolling cache for a sliding window then)
    cache = model.new_cache(capacity=total if window is None else min(total, window),
                            **({"rolling": False} if use_static else {}))
    mask = attention_mask
    if mask is not None:
        mask = torch.cat([mask.bool(), mask.new_ones(batch, max_new_tokens, dtype=torch.bool)], 1)
    out = ids.new_empty(batch, total)  # filled in place: no per-token concatenation
    out[:, :prompt_len] = ids
    length = prompt_len
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    step_input = ids[:, start:]
    static = None  # the compiled step's side, from the second new token on
    for i in range(max_new_tokens):
        if window is not None and length - start > window:  # slide the window by one
            start, cache = length - window, None
            step_input = out[:, start:length]
        if static is not None:
            logits = static(model, step_input)
        else:
            logits = model(step_input, cache=cache,
                           attention_mask=None if mask is None else mask[:, start:length])[:, -1]
            if use_static and i + 1 < max_new_tokens:  # the prompt is in: on to the static cache
                from attnlab.generation.compiled import StaticDecoding, capacity_for

                static = StaticDecoding(compiled, cache, mask, length,
                                        capacity_for(total - 1, window))
        logits = logits.float()
        if repetition_penalty != 1.0:
            logits = penalise_repeats(logits, out[:, :length], repetition_penalty)
        if temperature > 0:
            probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
            next_token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:
            next_token = logits.argmax(-1)
        if eos_id is not None:
            next_token = next_token.masked_fill(done, eos_id)
            done |= next_token == eos_id
        out[:, length] = next_token
        length += 1
        step_input = out[:, length - 1 : length]
        if on_token is not None and on_token(out[:, prompt_len:length]):
            break
        if eos_id is not None and done.all():
            break
    return out[:, :length]


def for_decoding(model: nn.Module, device: torch.device | str | None = None,
                 precision: str = "fp32", integer: bool = False, rows: int = 1,
                 kv_cache: str | None = None) -> nn.Module:
    """``model`` ready to decode on ``device``: its matrices cast to ``precision`` (decoding reads
    every weight once per token, so half the bytes is what makes it faster) and, on a CPU, its
    fp32, bf16 or fp16 linears on attnlab's few-row kernel (:func:`decoding_layout_`; where
    that cannot be built, fp32 is stored input-major for ``rows`` = 1 sequence, row-major for
    a batch). On that kernel only the matrices take ``precision``: the activations, norms and
    KV cache are float32 (:func:`float32_activations_`); elsewhere (a GPU) the whole model is
    cast. An
    ``integer`` model (``--int4``, ``--int8``) keeps its integer matrices and the float dtype
    ``quantize`` gave the other matrices (float32 activations on the kernel), runs on the CPU
    only, and gets an int8 output layer
    (:func:`integer_head`). Integer and kernel layers have their Q/K/V and W₁/W₃ stacked into
    one product each (:func:`~attnlab.nn.layout.fuse_projections_`). ``model`` is changed in
    place and its names change (``qkv``, ``w13``): a model for decoding, not one to save or to
    add adapters to. ``kv_cache`` ("fp32", "bf16", "fp16"): the dtype its KV caches are stored
    in (``model.cache_dtype``; default: the activations'); a 16-bit cache under float32
    activations halves the bytes a long context reads at each token, its keys and values
    rounded as they are stored (the compiled step may then part from eager greedy text)."""
    from attnlab.hardware import DTYPES

    on_cpu = (torch.device(device).type if device is not None
              else next(model.parameters()).device.type) == "cpu"
    kernel = on_cpu and cpu_kernels.available()  # float32 activations (below)
    if kv_cache is not None:  # checked before the model changes
        if kv_cache not in DTYPES or not hasattr(type(model), "cache_dtype"):
            raise BadInput(f"kv_cache must be one of {', '.join(DTYPES)} for a decoder-only "
                           f"model, got {kv_cache!r} for a {type(model).__name__}")
        if not kernel and kv_cache != precision:
            raise BadInput(f"a {kv_cache} KV cache under {precision} activations is read by "
                           "attnlab's CPU kernels only; elsewhere the cache is the activations' "
                           "dtype")
    if integer:
        if not on_cpu:
            raise BadInput(f"integer weights (--int4, --int8) run on the CPU only, not on "
                           f"{device}")
        integer_head(model)
        dtype = None  # the float matrices keep the dtype quantize gave them
    else:
        dtype = DTYPES[precision]
        if not kernel:  # the whole model in the dtype
            model = model.to(device=device, dtype=dtype)
        elif device is not None:  # (float32_activations_ casts the matrices alone)
            model = model.to(device)
    model = fuse_projections_(decoding_layout_(model, rows))  # (after: KernelLinear)
    if kernel:
        float32_activations_(model, dtype)
    if kv_cache is not None:
        model.cache_dtype = DTYPES[kv_cache]
    return model


@torch.no_grad()
def float32_activations_(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Decode with float32 activations around 16-bit matrices, in place; returns ``model``: each
    :class:`~attnlab.nn.layout.KernelLinear`'s weight and bias and each token embedding's table
    in ``dtype`` (None: as they are; a parameter tied to one of them follows it), the integer
    layers as they are, every other floating parameter and buffer (norms, positions, other
    layers) in float32, positional tables computed again in float32, and the token embeddings'
    rows widened (``out_dtype``). So the residual stream, the norms, the KV cache and the logits
    are float32, as llama.cpp keeps the values between its products (its KV cache is 16-bit by
    default; here float32 unless ``kv_cache`` asks for 16 bits). The kernel widens ``W``
    exactly, so a layer computes ``x · Ŵᵀ`` of the rounded weights ``Ŵ`` in float32's sums, for
    up to its 8 rows (a token, a batch of 8); more rows (a prompt, speculative decoding's
    verification of 11 tokens, a server's larger batch) round ``x`` for the 16-bit GEMM, as
    before: the kernel at 16 rows took 2x that GEMM's time. A step of 4 to 8 sequences (or
    beams) through a bf16 layer rounds ``x`` too where the kernels run AVX512-BF16, for
    ``vdpbf16ps`` (:func:`~attnlab.nn.cpu_kernels.bf16_dot_rows`: with float32 ``x`` such a
    batch is compute-bound); 1 to 3 sequences, and up to 8 tokens of one sequence, never do.

    Why: with bf16 activations every op rounds its output, and the compiled step, which fuses
    ops and rounds where it fuses, parted from the eager step's greedy SmolLM2 text after 22
    tokens (now 256 of 256 alike). The cost is the KV cache's bytes: 5–6% of a token at a few
    hundred positions, 10–12% at 1,600 (docs/benchmarks.md, seventh pass)."""
    from attnlab.nn.embeddings import TokenEmbedding
    from attnlab.nn.positional import PositionalEncoding
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    matrices = {id(t) for m in model.modules() if isinstance(m, (KernelLinear, TokenEmbedding))
                for t in m.parameters(recurse=False)}
    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            continue
        for t in m.parameters(recurse=False):
            own = dtype if id(t) in matrices else torch.float32
            if t.is_floating_point() and own is not None and t.dtype != own:
                t.data = t.data.to(own)  # (the same Parameter: a tied one follows)
        for name, t in list(m.named_buffers(recurse=False)):
            if t.is_floating_point() and t.dtype != torch.float32:
                m._buffers[name] = t.float()
        if isinstance(m, PositionalEncoding):  # computed in float32, not bf16's values widened
            device = next((b.device for b in m.buffers(recurse=False)), None)
            m.reset_buffers()
            if device is not None:
                m.to(device)
        if isinstance(m, TokenEmbedding):
            m.out_dtype = torch.float32
    return model


def integer_head(model: nn.Module) -> None:
    """The output layer ``lm_head`` as int8 codes with one scale per row (the embedding,
    often tied to it, stays float: a lookup reads one row). For SmolLM2 the head is 113 MB
    in float32, the largest matrix a token reads, and 28 MB in int8; measured in
    docs/benchmarks.md (speed, and nats per token). Only where attnlab's int8 kernel runs:
    its float32 activations keep the logits' order, which PyTorch's bf16 kernel did not."""
    from attnlab.nn.quantized import Int8Linear

    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear) and cpu_kernels.available():
        model.lm_head = Int8Linear.from_linear(head)


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
