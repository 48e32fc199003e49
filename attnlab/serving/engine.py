"""Continuous batching: every request in flight decodes in one batch, one forward per step.

Decoding reads every weight once per step whatever the batch size, so on a CPU (or a GPU) a
step for 8 sequences costs little more than a step for one. The engine keeps the sequences in
flight as the rows of one left-padded batch over one KV cache:

    keys    (rows, kv_heads, T, d_k)      T = the longest row's tokens so far
    mask    (rows, T)                      True at a row's real tokens (its padding is on the left)
    step:   logits = model(last (rows, 1), cache, mask ++ 1)    one new token for every row

A request joins between two steps: its prompt is run alone (prefill, with the other new
prompts of that moment), its first token chosen, and its keys and values are put into the
batch's cache right-aligned, the shorter side padded on the left. A row leaves as soon as it
ends (its end token, its token or time limit, its client gone): its row is dropped, and the
columns that are padding in every remaining row are cut off, so T never exceeds the longest
row in flight and each row stays within the model's context. Positions come from the mask
(each row counts its own real tokens), so a row's tokens equal those of decoding it alone, up
to the rounding of a batched matrix product (a bf16 model's step of 4 rows or more multiplies
activations rounded to bf16 where the kernels run AVX512-BF16,
:func:`~attnlab.cpu.kernels.bf16_dot_rows`).

With a compiled one-token step (``serve``'s default), the batch lives in fixed shapes instead
(:mod:`attnlab.serving.static_batch`): the same rows, columns and masks, in storage that
changes only when a request joins or the columns run out, so a few graphs (one for each row
bucket: 1, 2, 4, … rows, and ``max_batch``) serve every step.

Everything that touches the model runs on the engine's one thread; other threads call
:meth:`Engine.submit` and :meth:`Handle.cancel` and receive tokens through ``on_tokens``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.cpu.kernels import hand_over_threads
from attnlab.errors import BadInput
from attnlab.generation.compiled import CompiledStep
from attnlab.generation.decode import last_logits, next_tokens
from attnlab.serving.prompt_cache import DEFAULT_MB, PromptCache
from attnlab.serving.static_batch import StaticBatch, row_buckets


@dataclass
class Request:
    """One sequence to continue. ``on_tokens(new_ids, finish)`` is called on the engine's
    thread after each step with the new token ids (possibly none) and, on the last call,
    ``finish``: ``"stop"`` (the end token), ``"length"`` (``max_new_tokens`` or the time limit),
    ``"cancelled"`` (the engine shut down before it ended) or ``"error"``."""

    ids: list[int]
    max_new_tokens: int
    on_tokens: Callable[[list[int], str | None], None]
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    eos_ids: tuple[int, ...] = ()
    deadline: float | None = None  # time.monotonic() past which the request ends ("length")


@dataclass
class Handle:
    """What :meth:`Engine.submit` returns: :meth:`cancel` ends the request at the next step,
    with no further call to its ``on_tokens`` (its client went away, or found a stop string)."""

    request: Request
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Row:
    handle: Handle
    generator: torch.Generator | None
    produced: int = 0
    finish: str | None = field(default=None)


class Engine:
    """Decodes the requests given to :meth:`submit` together, at most ``max_batch`` at a time
    (the others wait their turn, first come first served). ``model`` is a decoder-only model
    ready for decoding (:func:`attnlab.cpu.for_decoding`)."""

    def __init__(self, model: nn.Module, max_batch: int = 8,
                 compiled: CompiledStep | None = None,
                 prompt_cache_bytes: int = DEFAULT_MB << 20):
        if max_batch < 1:
            raise BadInput(f"max_batch must be >= 1, got {max_batch}")
        # earlier prompts' keys and values, for prompts that begin as they did (0: none)
        self.prompts = PromptCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None
        self.model = model.eval()
        self.max_batch = max_batch
        # with a compiled step the batch lives in fixed shapes (serving/static_batch.py)
        self._static = None if compiled is None else StaticBatch(model, max_batch, compiled)
        self.compiled = compiled
        self.context = model.config.context
        self.device = next(model.parameters()).device
        self._waiting: list[Handle] = []
        self._rows: list[_Row] = []
        self._cache = None
        self._mask: Tensor | None = None  # (rows, T)
        self._last: Tensor | None = None  # (rows,) each row's newest token
        self._wake = threading.Condition()
        self._closing = False
        self._halt = False
        self._thread = threading.Thread(target=self._run, name="attnlab-engine", daemon=True)
        self.steps = 0  # batched decoding steps so far (tests and logs)

    # --- the other threads' side ------------------------------------------------------------
    def start(self) -> Engine:
        """Start the engine's thread. From here on that thread runs the model: the caller's
        OpenMP workers are let go (:func:`~attnlab.cpu.kernels.hand_over_threads`), or every
        parallel region of the engine's steps would wait for sleeping workers."""
        if self.device.type == "cpu":
            hand_over_threads()
        self._thread.start()
        return self

    def warm_up(self, token: int = 0) -> float:
        """With a compiled step, compile its graphs now (each row bucket of the static batch,
        the full batch first, at the first capacity bucket) rather than while clients wait:
        dummy requests of one ``token`` run through the engine. Returns the seconds it
        took."""
        begun = time.perf_counter()
        if self.compiled is None:
            return 0.0
        for count in reversed(row_buckets(self.max_batch)):
            done = [threading.Event() for _ in range(count)]
            with self._wake:  # all at once, so that they join the same step
                for event in done:
                    self._waiting.append(Handle(Request(
                        [token], 3, lambda _new, finish, e=event: finish and e.set())))
                self._wake.notify()
            for event in done:
                event.wait()
        return time.perf_counter() - begun

    def submit(self, request: Request) -> Handle:
        """Queue ``request``; it joins the batch between two steps. Its prompt plus
        ``max_new_tokens`` must fit the model's context (the caller says so to its client)."""
        total = len(request.ids) + request.max_new_tokens
        if not request.ids:
            raise BadInput("a request needs at least one prompt token")
        if self.context is not None and total > self.context:
            raise BadInput(f"{len(request.ids)} prompt tokens + {request.max_new_tokens} new "
                           f"exceed the model's context of {self.context} tokens")
        handle = Handle(request)
        with self._wake:
            if self._closing:
                raise BadInput("the server is shutting down")
            self._waiting.append(handle)
            self._wake.notify()
        return handle

    @property
    def busy(self) -> int:
        """Requests waiting or in flight."""
        with self._wake:
            return len(self._waiting) + len(self._rows)

    def stop(self, grace: float = 0.0) -> None:
        """Refuse new requests, let those in flight run for up to ``grace`` seconds, then end
        the rest with finish ``"cancelled"`` and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        end = time.monotonic() + grace
        while self.busy and time.monotonic() < end:
            time.sleep(0.02)
        with self._wake:
            self._halt = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    # --- the engine's thread ----------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._halt and not self._waiting and not self._rows:
                        self._wake.wait()
                    if self._halt:
                        break
                    room = self.max_batch - len(self._rows)
                    joining, self._waiting = self._waiting[:room], self._waiting[room:]
                joining = [h for h in joining if not h.cancelled]
                if joining:
                    try:  # a prompt that fails (out of memory) ends its own requests only
                        self._join(joining)
                    except Exception as e:
                        self._fail(e, [h for h in joining
                                       if all(r.handle is not h for r in self._rows)])
                try:
                    if self._rows:
                        self._step()
                except Exception as e:  # a bug: end every request rather than hang them
                    self._fail(e, self._take_all())
        self._finish(self._take_all(), "cancelled")
        if self.prompts is not None:
            self.prompts.clear()

    def _fail(self, error: Exception, handles: list[Handle]) -> None:
        import traceback

        traceback.print_exception(error)
        self._finish(handles, "error")

    def _take_all(self) -> list[Handle]:
        """Every request in flight or waiting, which the engine then forgets."""
        with self._wake:
            handles = [r.handle for r in self._rows] + self._waiting
            self._rows, self._waiting = [], []
        self._cache = self._mask = self._last = None
        if self._static is not None:
            self._static.rows = 0
        return handles

    @staticmethod
    def _finish(handles: list[Handle], finish: str) -> None:
        """Tell each of ``handles`` it ended with ``finish``; a failing callback stops no
        other."""
        import traceback

        for h in handles:
            if not h.cancelled:
                try:
                    h.request.on_tokens([], finish)
                except Exception as e:
                    traceback.print_exception(e)

    def _join(self, handles: list[Handle]) -> None:
        """Prefill the new prompts (left-padded together), choose their first tokens, and put
        their keys and values into the batch's cache. Where a prompt begins with tokens an
        earlier prompt had (:class:`~attnlab.serving.prompt_cache.PromptCache`), its cache's
        first columns come from there, and the join runs only the last ``width`` tokens of
        each prompt, ``width`` the most that any of them has to run; every row stays
        contiguous (padding on its left only, as positions and ALiBi's distances assume):

            row i   [ padding | c_i tokens from its entry | its last len_i − c_i tokens ]
                      columns 0 … reused − 1                columns reused … reused + width − 1
        """
        n = len(handles)
        prompts = [h.request.ids for h in handles]
        found = [self.prompts.longest(p) if self.prompts else (0, None) for p in prompts]
        width = max(len(p) - length for p, (length, _) in zip(prompts, found, strict=True))
        cached = [max(0, len(p) - width) for p in prompts]  # c_i <= what its entry holds
        reused = max(cached)
        ids = torch.zeros(n, width, dtype=torch.long, device=self.device)
        mask = torch.zeros(n, reused + width, dtype=torch.bool, device=self.device)
        for i, (prompt, c) in enumerate(zip(prompts, cached, strict=True)):
            new = prompt[c:]
            ids[i, width - len(new):] = torch.tensor(new, device=self.device)
            mask[i, reused + width - len(prompt):] = True  # contiguous, ending last
        # never a rolling cache: rows of different lengths share the columns
        cache = self.model.new_cache(capacity=reused + width + 64, rolling=False)
        if reused:
            _start_from(cache, [layers for _, layers in found], cached, width + 64)
            self.prompts.reused += sum(cached)
        logits = last_logits(self.model, ids, cache, mask)
        if self.prompts is not None:
            for i, prompt in enumerate(prompts):
                if self.prompts.admits(prompt, _bytes(cache, len(prompt))):
                    real = torch.arange(reused + width - len(prompt), reused + width,
                                        device=self.device)
                    self.prompts.store(prompt, [(layer.k[i : i + 1].index_select(2, real),
                                                 layer.v[i : i + 1].index_select(2, real))
                                                for layer in cache])
        rows = [_Row(h, _generator(h.request, self.device)) for h in handles]
        first = self._choose(logits.float(), rows)
        keep = self._emit(rows, first)
        if len(keep) < n:  # ended at their first token: they never join
            if not keep:
                return
            index = torch.tensor(keep, device=self.device)
            cache.reorder(index)
            rows, mask, first = [rows[i] for i in keep], mask[index], first[index]
        self._merge(rows, cache, mask, first)

    def _merge(self, rows: list[_Row], cache, mask: Tensor, first: Tensor) -> None:
        """The batch's cache and the new rows' cache as one, both right-aligned at
        T = max(lengths); padding columns hold zeros (masked keys must not be NaN). With a
        compiled step, the static batch takes them instead."""
        if self._static is not None:
            self._static.add(cache, mask)
            with self._wake:
                self._rows = self._rows + rows
            self._last = first if self._last is None else torch.cat([self._last, first])
            return
        if not self._rows:
            self._rows, self._cache, self._mask, self._last = rows, cache, mask, first
            return
        old, new = self._mask.shape[1], mask.shape[1]
        t = max(old, new)
        b = len(self._rows)
        for mine, theirs in zip(self._cache, cache, strict=True):
            k, v = mine.k[:, :, :old], mine.v[:, :, :old]
            capacity = max(t + 64, mine.k.shape[2])
            joined = []
            for a, c in ((k, theirs.k[:, :, :new]), (v, theirs.v[:, :, :new])):
                buffer = a.new_zeros(b + len(rows), a.shape[1], capacity, a.shape[3])
                buffer[:b, :, t - old:t] = a
                buffer[b:, :, t - new:t] = c
                joined.append(buffer)
            mine.k, mine.v = joined
            mine.length = t
        grown = torch.zeros(b + len(rows), t, dtype=torch.bool, device=self.device)
        grown[:b, t - old:] = self._mask
        grown[b:, t - new:] = mask
        self._mask = grown
        with self._wake:
            self._rows = self._rows + rows
        self._last = torch.cat([self._last, first])

    def _step(self) -> None:
        """One token for every row in flight."""
        if self._static is not None:
            logits = self._static(self._last)
        else:
            ones = self._mask.new_ones(len(self._rows), 1)
            self._mask = torch.cat([self._mask, ones], 1)
            logits = last_logits(self.model, self._last[:, None], self._cache, self._mask)
        self.steps += 1
        self._last = self._choose(logits.float(), self._rows)
        keep = self._emit(self._rows, self._last)
        if len(keep) < len(self._rows):
            self._drop(keep)

    def _choose(self, logits: Tensor, rows: list[_Row]) -> Tensor:
        """``logits (rows, vocab)`` -> ``(rows,)`` next tokens: argmax for greedy rows, a
        sample from softmax(logits / T) (top-k, top-p filtered) with each row's own
        generator for the others."""
        chosen = logits.argmax(-1)
        for i, row in enumerate(rows):
            r = row.handle.request
            if r.temperature > 0:
                chosen[i] = next_tokens(logits[i : i + 1], r.temperature, r.top_k, r.top_p,
                                        row.generator)[0]
        return chosen

    def _emit(self, rows: list[_Row], tokens: Tensor) -> list[int]:
        """Hand each of ``rows`` its token; the indices of the rows that go on."""
        now = time.monotonic()
        keep = []
        for i, (row, token) in enumerate(zip(rows, tokens.tolist(), strict=True)):
            r, h = row.handle.request, row.handle
            if h.cancelled:
                continue
            row.produced += 1
            finish = None
            if token in r.eos_ids:
                finish = "stop"
            elif row.produced >= r.max_new_tokens or (r.deadline is not None
                                                      and now >= r.deadline):
                finish = "length"
            r.on_tokens([] if finish == "stop" else [token], finish)
            if finish is None:
                keep.append(i)
        return keep

    def _drop(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` of the batch, then cut the columns that are padding in
        every one of them."""
        with self._wake:
            self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache = self._mask = self._last = None
            if self._static is not None:
                self._static.rows = 0
            return
        index = torch.tensor(keep, device=self.device)
        if self._static is not None:
            self._static.keep(index)
            self._last = self._last[index]
            return
        self._cache.reorder(index)
        self._mask, self._last = self._mask[index], self._last[index]
        cut = int(self._mask.any(0).int().argmax())  # the first column some row uses
        if cut:
            for layer in self._cache:
                layer.k, layer.v = layer.k[:, :, cut:], layer.v[:, :, cut:]
                layer.length -= cut
            self._mask = self._mask[:, cut:]


def _start_from(cache, entries: list, cached: list[int], room: int) -> None:
    """Fill every layer of ``cache`` (one row per entry) with the first ``cached[i]`` keys and
    values of entry i, right-aligned at column ``max(cached)`` (zeros on their left: masked
    keys must not be NaN), with ``room`` columns after them."""
    reused = max(cached)
    for j, layer in enumerate(cache):
        pair = []
        for which in (0, 1):
            first = next(e for e in entries if e is not None)[j][which]
            _, h, _, d = first.shape
            storage = first.new_zeros(len(entries), h, reused + room, d)
            for i, (layers, c) in enumerate(zip(entries, cached, strict=True)):
                if c:
                    storage[i, :, reused - c : reused] = layers[j][which][0, :, :c]
            pair.append(storage)
        layer.k, layer.v = pair
        layer.length = reused


def _bytes(cache, tokens: int) -> int:
    """The bytes of ``tokens`` columns of one row's keys and values in every layer of
    ``cache``."""
    return sum(2 * layer.k.shape[1] * tokens * layer.k.shape[3] * layer.k.element_size()
               for layer in cache)


def _generator(request: Request, device: torch.device) -> torch.Generator | None:
    if request.temperature <= 0:
        return None
    # a fresh seed without reseeding the process's own generator
    seed = request.seed if request.seed is not None else secrets.randbits(63)
    return torch.Generator(device=device).manual_seed(seed)
