"""A compiled one-token decoding step (gpt-fast's recipe), for decoder-only models and for
the encoder–decoder's greedy and beam search.

Eager decoding runs the model's Python code at every token: a dozen small operations a layer,
each dispatched on its own, with its own temporaries. For a small model on a CPU that overhead
is as large as the matrix products themselves. ``torch.compile`` turns one token's forward
pass into a few fused kernels, but only if every token has the same shapes:

    prefill   logits = model(prompt, growing cache)           eager, any length, one pass
    convert   StaticCache.from_cache(cache, capacity)          capacity = prompt + new tokens,
                                                               rounded up to a bucket of 256
    step t    logits = step(token_t, key_mask, cache)          compiled once per (batch, capacity)

The step's inputs keep their shapes from token to token: the cache's storage (``capacity``
slots), the key mask ``(batch, capacity)`` — True at the slots that hold a real token, the new
one included — and the slot to write (a tensor inside the cache). Each row's position is the
count of its real tokens minus one, as :func:`~attnlab.generation.decode.generate`
counts positions under left padding, so the step computes what the eager step computes; a
sliding window (Mistral) becomes a band over those counts.

The encoder–decoder's step (:func:`encoder_decoder_token`) is the same idea with one position
for the whole batch (target sequences are never left-padded): the slot is the position, the
self-attention sees slots ≤ it, and the cross-attention reads the keys and values of the
encoder output that the first, eager step computed.
:class:`DecoderSteps` drives either path for
:func:`~attnlab.generation.seq2seq.greedy_decode` and
:func:`~attnlab.generation.beam.beam_search`; beam search reorders the static cache's rows in
place.

A capacity bucket keeps the number of compiled graphs small (one per batch size and bucket; the
encoder–decoder's also per source length, which ``translate`` pads to a multiple of
:data:`~attnlab.generation.seq2seq.SOURCE_BUCKET`); inductor's caches persist on disk
between runs, while Dynamo traces the step again in each process (the compile time the CLI
reports). Each call checks Dynamo's guards, some 2,500 over the model's modules, weights and
the cache (a noticeable share of a small model's token on a CPU): a request's first step checks them
all, its later steps, whose model and objects the loop itself keeps, only those that tell the
graphs apart (``CompiledStep(..., again=True)``). On a CPU each shape's graph is compiled ahead
of its first call (``aot_compile``) and kept by the step itself: Dynamo then looks nothing up at
all, the first step of a request checks that graph's guards and the later ones none.
"""

from __future__ import annotations

import inspect
import threading
import time
import warnings
import weakref

import torch
from torch import Tensor, nn

from attnlab.cpu import kernels as cpu_kernels
from attnlab.nn.cache import DecoderCache, StaticCache, StaticDecoderCache

BUCKET = 256  # capacities are multiples of this (or the model's context, when smaller)
TARGET_BUCKET = 32  # the encoder–decoder's: a translation is tens of tokens


def capacity_for(total: int, context: int | None, bucket: int = BUCKET) -> int:
    """Slots for ``total`` positions: rounded up to a multiple of ``bucket``, never past the
    model's ``context`` (which ``total`` must fit)."""
    capacity = -(-total // bucket) * bucket
    return capacity if context is None else min(capacity, context)


def one_token(model: nn.Module, token: Tensor, key_mask: Tensor, cache: StaticCache) -> Tensor:
    """Float32 next-token logits ``(batch, vocab)`` of ``token (batch, 1)``, written into
    ``cache`` at its slot. ``key_mask (batch, capacity)``: True at the slots holding real
    tokens, this one included."""
    positions = key_mask.sum(-1, keepdim=True) - 1  # (batch, 1): each row's own count
    x = model.embed_tokens(token, positions)
    mask = key_mask[:, None, None, :]
    window = model.config.sliding_window
    if window is not None:  # i − W < j ≤ i, in real tokens (left padding shifts both)
        counted = key_mask.long().cumsum(-1)
        mask = mask & (counted > positions + 1 - window)[:, None, None, :]
    h = model.blocks(x, mask=mask, positional=model.positional, positions=positions,
                     cache=cache)
    return model.lm_head(h[:, -1:])[:, 0].float()  # (batch, 1, d): as the eager step's head


def encoder_decoder_token(model: nn.Module, token: Tensor, memory: Tensor, src_mask: Tensor,
                          cache: StaticDecoderCache) -> Tensor:
    """Float32 next-token logits ``(batch, tgt_vocab)`` of an encoder–decoder's ``token (batch,
    1)`` at position ``cache.slots``, written into that slot; the self-attention sees the slots
    up to it, the cross-attention ``memory (batch, src_len, d)`` where ``src_mask (batch, 1, 1,
    src_len)`` allows (its keys and values already in the cache). What
    :meth:`~attnlab.models.Transformer.decode` computes, with the position a tensor."""
    positions = cache.slots  # (1,): every row's target position
    positional = model.decoder_positional
    y = positional.embed(model.tgt_embed(token), positions)
    tgt_mask = (cache.key_positions <= positions).view(1, 1, 1, -1)  # the slots written so far
    hidden = model.decoder(y, memory, tgt_mask=tgt_mask, memory_mask=src_mask,
                           positional=positional, positions=positions, cache=cache)
    if model.config.scale_tied_logits:  # T5 (see Transformer.decode)
        hidden = hidden * model.config.d_model ** -0.5
    return model.lm_head(hidden[:, -1:])[:, 0].float()


def _signature(model: nn.Module, args: tuple) -> tuple:
    """What makes a new graph: the model, each tensor's shape, strides, dtype and device, each
    cache's capacity and storage dtype."""
    parts: list = [id(model)]
    for a in args:
        if isinstance(a, Tensor):  # (strides too: a graph compiled ahead is called unchecked)
            parts.append((tuple(a.shape), a.stride(), a.dtype, a.device))
        else:  # a static cache
            first = a[0] if isinstance(a, StaticCache) else a[0].self_attn
            parts.append((a.capacity, first.k.dtype, first.k.device))
    return tuple(parts)


class CompiledStep:
    """A one-token step, :func:`one_token` by default (``function=encoder_decoder_token`` for
    the encoder–decoder), compiled with ``torch.compile`` (inductor's C++ backend on a CPU;
    on a GPU, Triton kernels replayed as one CUDA graph a token; ``backend`` picks another,
    e.g. ``"eager"`` in tests), with what compiling cost: ``compile_seconds`` is the time of
    each new shape's first call (tracing, code generation and that step), ``compiles`` how
    many there were. Shapes are static: a new batch size or capacity compiles a new graph, a
    new token or position never does."""

    def __init__(self, backend: str = "inductor", function=one_token):
        self.backend, self.function = backend, function
        self.compile_seconds = 0.0
        self.compiles = 0
        # steps whose graphs' guards all failed (an ``again`` step through Dynamo's lookup, a
        # request's first step on a graph compiled ahead), compiling again
        self.guard_misses = 0
        # the graphs Dynamo (or the step, for graphs compiled ahead) may keep before it refuses
        # to compile another, or drops the oldest (a server raises it: a graph for each row
        # bucket and capacity)
        self.most_graphs = 64
        self._shapes: set[tuple] = set()
        self._compiled: dict[str, tuple] = {}  # device type -> (compiled function, graphs?)
        # shape -> its graphs compiled ahead (CPU inductor), the last one a check chose first;
        # called with no lookup by Dynamo. None once compiling ahead failed here (the step
        # then runs through Dynamo's lookup)
        self._ahead: dict[tuple, list] | None = {}
        self._marked = lambda: None  # (a weak reference to) the cache last marked static

    def _for(self, args: tuple) -> tuple:
        """``(compiled function, whether it runs as CUDA graphs)`` for the device of ``args``:
        on CUDA, inductor's "reduce-overhead" mode records the step as a CUDA graph, so a
        token costs one launch instead of one per kernel (gpt-fast's recipe)."""
        device = next(a.device.type for a in args if isinstance(a, Tensor))
        if device not in self._compiled:
            graphs = device == "cuda" and self.backend == "inductor"
            # Inductor's wrapper checks each input's size and alignment at every call, some 900
            # checks a token for SmolLM2: Dynamo's guards have checked them already. On a CPU
            # the wrapper itself is C++ (``cpp_wrapper``): the Python one calls each of a
            # token's few hundred kernels and allocations through the interpreter, which cost
            # a small model as much as its attention. Its first compile takes longer (the
            # wrapper is a C++ file of its own); inductor's cache keeps it for later runs.
            options = None
            if self.backend == "inductor" and not graphs:  # (those this torch knows)
                known = torch._inductor.config
                options = {k: False for k in ("size_asserts", "alignment_asserts")
                           if hasattr(known, k)}
                if hasattr(known, "cpp_wrapper") and device == "cpu":
                    options["cpp_wrapper"] = True
                options = options or None
            self._compiled[device] = (torch.compile(
                self.function, backend=self.backend, dynamic=False, fullgraph=True,
                mode="reduce-overhead" if graphs else None, options=options), graphs)
        return self._compiled[device]

    def _mark_static(self, args: tuple) -> None:
        """A CUDA graph replays fixed addresses: the caches' storage, which the step writes
        in place, is declared so (not copied in and out at every token). A new cache (a new
        request) has new addresses, and its first step records the graph again; Dynamo does
        not guard them, so nothing recompiles."""
        for a in args:
            if isinstance(a, (StaticCache, StaticDecoderCache)) and a is not self._marked():
                for layer in a:
                    kv = layer if isinstance(a, StaticCache) else layer.self_attn
                    torch._dynamo.mark_static_address(kv.k, guard=False)
                    torch._dynamo.mark_static_address(kv.v, guard=False)
                self._marked = weakref.ref(a)

    def __call__(self, model: nn.Module, *args, again: bool = False) -> Tensor:
        """The step's logits. ``again``: the caller's own loop calls with the same model and
        the same objects, of the same shapes, as its previous call, which ran every guard (a
        request's later tokens). Such a call then checks no guard where the graph was
        compiled ahead (a CPU), and elsewhere runs only Dynamo's guards that tell this
        function's graphs apart (``skip_guard_eval_unsafe``: nothing it skips can have
        changed), where all of them are a noticeable share of a compiled small model's token
        on a CPU. Dynamo's stance is the process's: the steps of every ``CompiledStep`` run
        one at a time, and a stance the user set (``force_eager``, …) is kept; another
        compiled function that a thread of the caller's own runs meanwhile would skip its
        guards too. Where those guards match no graph (``torch._dynamo.reset()`` discarded the
        graphs), or a graph compiled ahead fails its guards (a weight's dtype changed), the
        step compiles again instead of failing: ``guard_misses`` counts such steps."""
        shape = _signature(model, args)
        new = shape not in self._shapes
        begun = time.perf_counter()  # a compile's time includes importing Dynamo and inductor
        if new:
            # Each shape is a graph of its own (a server's row counts times capacity buckets):
            # more than Dynamo's default of 8 a function. Its settings are per thread, and the
            # thread that compiles (a server's engine) decides.
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, self.most_graphs)
            config.accumulated_recompile_limit = max(config.accumulated_recompile_limit,
                                                     2 * self.most_graphs)
        function, graphs = self._for(args)
        on_cpu = not graphs and any(isinstance(a, Tensor) and a.device.type == "cpu"
                                    for a in args)
        if on_cpu:
            cpu_kernels.available()  # built or loaded now: the trace only reads the answer
        if graphs:
            self._mark_static(args)
            torch.compiler.cudagraph_mark_step_begin()  # each call is a new step
        with _ONE_STEP:
            logits = None
            if (on_cpu and self.backend == "inductor" and self._ahead is not None
                    and _may_skip_guards() and not torch._dynamo.config.disable):
                graph, missed = self._ahead_for(function, shape, model, args, check=not again)
                if missed:  # every graph's guards failed (a weight's dtype changed)
                    self.guard_misses += 1
                new = new or missed or graph is None  # (None: Dynamo compiles it now)
                if graph is not None:
                    logits = graph(model, *args)
            if logits is None and again and not new and _may_skip_guards():
                try:
                    with _SKIP_GUARDS():
                        logits = function(model, *args)
                except RuntimeError as error:  # no graph matched on those guards alone
                    if "skip_guard_eval_unsafe" not in str(error):
                        raise
                    # (torch._dynamo.reset() discarded the graphs this step had compiled).
                    # Dynamo raises at the frame's lookup, and fullgraph=True makes the step
                    # one frame, so nothing of it ran: every guard now, and the compile that
                    # follows is timed as one
                    self.guard_misses += 1
                    new, begun = True, time.perf_counter()
            if logits is None:
                logits = function(model, *args)
        if graphs:  # the next step may reuse the graph's output memory: copy the logits out
            logits = logits.clone()
        if new:
            if graphs:
                torch.cuda.synchronize()
            self.compile_seconds += time.perf_counter() - begun
            self.compiles += 1
            self._shapes.add(shape)
        return logits

    def _ahead_for(self, function, shape: tuple, model: nn.Module, args: tuple,
                   check: bool) -> tuple:
        """``(graph, missed)``: a graph of ``shape`` compiled ahead of its call (Dynamo's
        ``aot_compile``: Dynamo's own trace and inductor's code, called with no lookup).
        Without ``check``, the one the last check chose (or a new one); with it, the first
        whose guards pass, else a new one, and ``missed`` says that the shape had graphs and
        none passed (the training mode or grad mode changed: both graphs are kept). ``(None,
        False)`` where compiling ahead failed (a torch without it, inductor's caches off,
        which it needs): said once, and this step runs through Dynamo's lookup from then on,
        its shapes compiled again there."""
        kept = self._ahead.setdefault(shape, [])
        if kept and not check:
            return kept[0], False
        for i, graph in enumerate(kept):
            if graph.guard_check(model, *args):
                kept.insert(0, kept.pop(i))  # the request's later (unchecked) steps run it
                return graph, False
        try:
            graph = function.aot_compile(((model, *args), {}))
            graph.disable_guard_check()  # checked here, at a request's first step only
        except Exception as error:  # noqa: BLE001 (Dynamo's own path raises what is real)
            warnings.warn(f"the compiled step could not be compiled ahead ({type(error).__name__}"
                          f": {str(error)[:200]}); it runs through Dynamo's lookup instead",
                          RuntimeWarning, stacklevel=3)
            self._ahead = None
            self._shapes.clear()  # each shape compiles again there, and is counted
            return None, False
        kept.insert(0, graph)
        while len(self._ahead) > 1 and sum(map(len, self._ahead.values())) > self.most_graphs:
            oldest = next(s for s in self._ahead if s != shape)  # the oldest shape goes
            del self._ahead[oldest]
            self._shapes.discard(oldest)
        return graph, len(kept) > 1


def _skip_guards():
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


_SET_STANCE = getattr(torch.compiler, "set_stance", None)  # (torch 2.6 added it)
_SKIP_GUARDS = (_skip_guards if _SET_STANCE is not None and "skip_guard_eval_unsafe" in
                inspect.signature(_SET_STANCE).parameters else None)
# Dynamo's stance is the process's, not a thread's: one step at a time sets and restores it.
_ONE_STEP = threading.Lock()


def _may_skip_guards() -> bool:
    """Whether the stance is Dynamo's default, so that skipping guards changes nothing else
    (a user's ``force_eager``, ``fail_on_recompile`` or forced backend stays as it is)."""
    from torch._dynamo import eval_frame

    stance = getattr(eval_frame, "_stance", None)
    return (_SKIP_GUARDS is not None and stance is not None
            and getattr(stance, "stance", None) == "default"
            and not getattr(stance, "skip_guard_eval_unsafe", True)
            and getattr(stance, "backend", "?") is None)


def new_step(encoder_decoder: bool = False) -> CompiledStep:
    """A :class:`CompiledStep` of a decoder-only model's one-token step (with
    ``encoder_decoder``, of an encoder–decoder's), compiled on its first call."""
    return CompiledStep(function=encoder_decoder_token if encoder_decoder else one_token)


class StaticDecoding:
    """The static-cache side of :func:`~attnlab.generation.decode.generate`: made from
    the growing cache the prompt filled, then one compiled step a token."""

    def __init__(self, step: CompiledStep, cache, attention_mask: Tensor | None, length: int,
                 capacity: int):
        self.step = step
        self.model: nn.Module | None = None  # the model of the last step
        self.cache = StaticCache.from_cache(cache, capacity)
        batch, device = cache[0].k.shape[0], cache[0].k.device
        self.slot = length  # the next slot (self.cache.slots holds it as a tensor too)
        # the token's own buffer: a slice of the output would bring its strides into the
        # graph's guards, and they change with the output's length
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        if attention_mask is None:
            self.key_mask[:, :length] = True
        else:
            self.key_mask[:, :length] = attention_mask[:, :length]

    def __call__(self, model: nn.Module, token: Tensor) -> Tensor:
        """Logits of ``token (batch, 1)``, fed at the next slot."""
        self.key_mask[:, self.slot] = True
        self.token.copy_(token)
        logits = self.step(model, self.token, self.key_mask, self.cache,
                           again=self.model is model)
        self.model = model
        self.cache.slots += 1  # in place: the compiled graph reads the same tensor
        self.slot += 1
        return logits


class DecoderSteps:
    """An encoder–decoder's decoding, one new token a call, for greedy and beam search:
    :meth:`~attnlab.models.Transformer.decode` against a growing cache, or, with ``compiled``
    (a :class:`CompiledStep` of :func:`encoder_decoder_token`), the first call eager (it fills
    the cross-attention keys and values) and every later one compiled against a static cache
    of ``capacity_for(max_len, bucket=TARGET_BUCKET)`` slots."""

    def __init__(self, model: nn.Module, memory: Tensor, src_mask: Tensor, max_len: int,
                 compiled: CompiledStep | None = None):
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.compiled, self.max_len = compiled, max_len
        self.cache: DecoderCache | StaticDecoderCache = model.new_cache(capacity=max_len)
        self.token: Tensor | None = None  # the compiled step's own input buffer

    def __call__(self, token: Tensor) -> Tensor:
        """Logits ``(batch, tgt_vocab)`` of ``token (batch, 1)``, the next position's input."""
        if self.token is None:
            logits = self.model.decode(token, self.memory, self.src_mask, cache=self.cache)
            if self.compiled is not None:  # (a translation is short: buckets of 32 slots)
                capacity = capacity_for(self.max_len, self.model.config.max_len, TARGET_BUCKET)
                self.cache = StaticDecoderCache.from_cache(self.cache, capacity)
                self.token = torch.zeros_like(token)
                self.filled = 1
            return logits[:, -1]
        self.token.copy_(token)
        logits = self.compiled(self.model, self.token, self.memory, self.src_mask, self.cache,
                               again=self.filled > 1)
        self.cache.slots += 1  # in place: the compiled graph reads the same tensor
        self.filled += 1
        return logits

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search's surviving hypotheses)."""
        if isinstance(self.cache, StaticDecoderCache):
            self.cache.reorder(index, self.filled)  # the written slots only
        else:
            self.cache.reorder(index)


__all__ = ["BUCKET", "CompiledStep", "DecoderSteps", "StaticDecoding", "capacity_for",
           "encoder_decoder_token", "one_token"]
