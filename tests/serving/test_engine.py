"""The continuous-batching engine against decoding each request alone, and the text stream.

Requests join a batch in flight at different moments, with prompts of different lengths, and
leave at different steps; every one must get the tokens :func:`generate` gives it alone. The
tiny models' heads are scaled up so that their choices have wide margins (a batched matrix
product rounds differently from a one-row one, which must not flip a near tie).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.generation.compiled import CompiledStep
from attnlab.generation.decode import generate
from attnlab.generation.pipeline import TextStream
from attnlab.serving.engine import Engine, Handle, Request
from attnlab.serving.static_batch import row_buckets
from tests.sampling import constant_logits_model, reference_draws

FAMILIES = {
    "gpt2": dict(preset="gpt-mini"),
    "llama": dict(preset="llama-mini", num_kv_heads=2),
    "mistral": dict(preset="llama-mini", num_kv_heads=2, sliding_window=4),
}


def _model(family: str):
    spec = dict(FAMILIES[family])
    config = ModelConfig.from_preset(spec.pop("preset"), vocab_size=40, d_model=32, n_heads=4,
                                     d_ff=64, n_decoder_layers=2, max_len=64, dropout=0.0,
                                     tie_embeddings=False, **spec)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return model


class Collect:
    """``on_tokens`` of one request: its tokens and finish, and an event when it ended."""

    def __init__(self):
        self.tokens: list[int] = []
        self.finish = None
        self.done = threading.Event()

    def __call__(self, new, finish):
        self.tokens.extend(new)
        if finish is not None:
            self.finish = finish
            self.done.set()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_requests_joining_and_leaving_get_the_tokens_of_decoding_alone(family, compiled):
    """Eagerly, and through the compiled step's static batch (traced by Dynamo, run eagerly;
    ``serve``'s default): the model's context of 64 columns fills up more than once, so the
    static batch also cuts its padding columns and moves rows on the way."""
    model = _model(family)
    step = CompiledStep(backend="eager") if compiled else None
    engine = Engine(model, max_batch=3, compiled=step).start()
    g = torch.Generator().manual_seed(1)
    lengths, news = [3, 11, 1, 6, 14, 8, 2], [12, 5, 20, 9, 7, 15, 4]
    prompts = [torch.randint(4, 40, (n,), generator=g).tolist() for n in lengths]
    eos = 5
    runs = []
    try:
        for i, (p, n) in enumerate(zip(prompts, news, strict=True)):
            runs.append(Collect())
            engine.submit(Request(p, n, runs[-1], eos_ids=(eos,) if i % 2 else ()))
            time.sleep(0.002 * (i % 3))  # some join alone, some together, mid-flight
        for r in runs:
            assert r.done.wait(30)
    finally:
        engine.stop()
    stopped = 0
    for i, (p, n, r) in enumerate(zip(prompts, news, runs, strict=True)):
        want = generate(model, torch.tensor([p]), n,
                        eos_id=eos if i % 2 else None)[0, len(p):].tolist()
        if i % 2 and eos in want:
            want = want[: want.index(eos)]
            stopped += 1
            assert r.finish == "stop"
        else:
            assert r.finish == "length"
        assert r.tokens == want, i
    assert engine.steps < sum(news)  # rows shared steps
    if compiled:  # a graph for each row count (1, 2, 3), none for a token or a repack
        # (how often the storage is remade depends on when the rows meet: a repack of full
        # storage is checked on its own in the next test)
        assert 1 <= step.compiles <= 3


def test_a_full_static_batch_cuts_its_padding_and_decodes_on():
    """One request, then another after it ended: the second starts at the first one's last
    column, so the 64-column storage fills mid-request and is remade without the columns no
    row uses (a repack); the tokens stay those of decoding alone."""
    model = _model("llama")
    step = CompiledStep(backend="eager")
    engine = Engine(model, max_batch=2, compiled=step).start()
    prompts = [[7, 9, 11], [8, 12, 30]]
    runs = []
    try:
        for p in prompts:
            runs.append(Collect())
            engine.submit(Request(p, 40, runs[-1]))
            assert runs[-1].done.wait(30)  # the first ends before the second joins
    finally:
        engine.stop()
    for p, r in zip(prompts, runs, strict=True):
        assert r.tokens == generate(model, torch.tensor([p]), 40)[0, len(p):].tolist()
    assert engine._static.repacks == 2  # the first storage, and the cut at column 64


class Spy(CompiledStep):
    """The eager-backend step, noting how many rows each call ran and whether it was told it
    repeats its last call (``again``: no guard to check)."""

    def __init__(self):
        super().__init__(backend="eager")
        self.rows: list[int] = []
        self.again: list[bool] = []

    def __call__(self, model, token, *args, again=False):
        self.rows.append(token.shape[0])
        self.again.append(again)
        return super().__call__(model, token, *args, again=again)


def test_the_step_runs_the_fewest_bucket_rows_that_hold_the_requests():
    """Buckets are the powers of two below ``max_batch``, then ``max_batch``; warming up
    compiles one graph each; three requests in flight run four rows, not eight, and still get
    the tokens of decoding alone. The first step after they join checks its graph's guards,
    the later ones repeat it (``again``)."""
    assert row_buckets(1) == [1]
    assert row_buckets(6) == [1, 2, 4, 6]
    assert row_buckets(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        row_buckets(0)
    model = _model("llama")
    step = Spy()
    engine = Engine(model, max_batch=8, compiled=step).start()
    try:
        engine.warm_up()
        assert step.compiles == 4 and sorted(set(step.rows)) == [1, 2, 4, 8]
        step.rows.clear()
        step.again.clear()
        prompts = [[7, 9, 11], [8, 12], [30, 4, 5, 6]]
        runs = [Collect() for _ in prompts]
        with engine._wake:  # all three join the same step
            for p, r in zip(prompts, runs, strict=True):
                engine._waiting.append(Handle(Request(p, 6, r)))
            engine._wake.notify()
        for r in runs:
            assert r.done.wait(30)
    finally:
        engine.stop()
    assert set(step.rows) == {4} and step.compiles == 4  # no new graph
    assert step.again == [False] + [True] * 4  # 6 tokens: the join's, then 5 steps
    assert step.guard_misses == 0  # each unchecked step found its graph
    for p, r in zip(prompts, runs, strict=True):
        assert r.tokens == generate(model, torch.tensor([p]), 6)[0, len(p):].tolist()


def test_dynamo_may_keep_a_graph_for_every_row_bucket_and_capacity():
    """An 8,192-token model served 8 rows at a time: 4 row buckets times 32 capacities of 256
    columns could all be compiled; the step's limit must let Dynamo keep them (its default
    of 64 graphs would make the 65th shape fail every request in flight)."""
    from types import SimpleNamespace

    from attnlab.serving.static_batch import StaticBatch

    step = CompiledStep(backend="eager")
    StaticBatch(SimpleNamespace(config=SimpleNamespace(context=8192)), 8, step)
    assert step.most_graphs >= 4 * 32
    small = CompiledStep(backend="eager")
    StaticBatch(SimpleNamespace(config=SimpleNamespace(context=64)), 2, small)
    assert small.most_graphs == 64  # never lowered


def test_the_batch_never_holds_more_than_max_batch_rows_and_cancel_ends_a_row():
    model = _model("llama")
    engine = Engine(model, max_batch=2)
    widths = []
    step = engine._step

    def watched():
        widths.append(len(engine._rows))
        step()

    engine._step = watched
    engine.start()
    runs = [Collect() for _ in range(5)]
    try:
        handles = [engine.submit(Request([7, 8, 9], 30, r)) for r in runs]
        handles[0].cancel()
        for r in runs[1:]:
            assert r.done.wait(30)
    finally:
        engine.stop()
    assert max(widths) == 2
    assert not runs[0].done.is_set()  # a cancelled request hears nothing more
    assert all(r.tokens == runs[1].tokens for r in runs[2:])


def test_a_request_past_the_context_is_refused_and_stop_cancels_the_rest():
    """Each step is slowed to 10 ms, so that the 60-token request is still in flight (its
    first token out) when ``stop()`` comes: it ends ``"cancelled"``, short of 60 tokens."""
    model = _model("gpt2")
    engine = Engine(model, max_batch=2)
    step = engine._step

    def slowed():
        time.sleep(0.01)
        step()

    engine._step = slowed
    engine.start()
    with pytest.raises(BadInput, match="exceed the model's context of 64"):
        engine.submit(Request([1] * 60, 5, Collect()))
    slow = Collect()
    engine.submit(Request([1, 2], 60, slow))
    waited = time.monotonic() + 30
    while not slow.tokens:  # in flight
        assert time.monotonic() < waited and not slow.done.is_set()
        time.sleep(0.002)
    engine.stop(grace=0)
    assert slow.done.wait(5) and slow.finish == "cancelled"
    assert 1 <= len(slow.tokens) < 60
    with pytest.raises(BadInput, match="shutting down"):
        engine.submit(Request([1], 1, Collect()))


def test_sampled_rows_follow_their_own_seed_whatever_else_is_in_the_batch():
    model = _model("llama")
    alone, crowded = Collect(), Collect()
    engine = Engine(model, max_batch=4).start()
    try:
        engine.submit(Request([4, 5, 6], 12, alone, temperature=1.0, seed=3))
        assert alone.done.wait(30)
        others = [Collect() for _ in range(3)]
        for o in others:
            engine.submit(Request([9, 9], 12, o, temperature=0.8, seed=11))
        engine.submit(Request([4, 5, 6], 12, crowded, temperature=1.0, seed=3))
        assert crowded.done.wait(30)
    finally:
        engine.stop()
    assert crowded.tokens == alone.tokens


def test_sampled_requests_draw_what_the_reference_draws_from_the_models_logits():
    """A model whose every step's logits are known: three sampled requests in one batch, each
    with its own settings and seed, get the seeded draws of transformers' processors
    (tests/sampling.py): the engine passes each row its temperature, top-k, top-p and
    generator."""
    z = torch.randn(40, generator=torch.Generator().manual_seed(5)) * 2
    engine = Engine(constant_logits_model(z), max_batch=4).start()
    settings = [dict(temperature=0.6), dict(temperature=1.8, top_k=7),
                dict(temperature=0.9, top_k=20, top_p=0.8)]
    runs = [Collect() for _ in settings]
    try:
        for seed, (setting, run) in enumerate(zip(settings, runs, strict=True)):
            engine.submit(Request([4, 5, 6], 16, run, seed=seed, **setting))
        for run in runs:
            assert run.done.wait(30)
    finally:
        engine.stop()
    for seed, (setting, run) in enumerate(zip(settings, runs, strict=True)):
        want = reference_draws(z, [[4, 5, 6]], 16, torch.Generator().manual_seed(seed),
                               **setting)
        assert run.finish == "length" and run.tokens == want[0], setting


def _byte_decoder(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def test_the_text_stream_never_splits_a_character_or_leaks_a_stop_string():
    text = "héllo wörld <|end|> after"
    data = list(text.encode())
    stream = TextStream(_byte_decoder, ["<|end|>"])
    pieces = [stream.feed([b]) for b in data]
    pieces.append(stream.feed([], final=True))
    assert "".join(pieces) == "héllo wörld "
    assert stream.stopped
    assert all("\ufffd" not in p and "<" not in p for p in pieces)
    # a prefix of a stop string that turns out not to be one is released
    stream = TextStream(_byte_decoder, ["<|end|>"])
    assert "".join(stream.feed([b]) for b in b"a <|en") == "a "
    assert stream.feed(list(b" no")) == "<|en no" and not stream.stopped


def test_the_engine_hands_the_cpu_threads_over_when_it_starts(monkeypatch):
    """From start() on the engine's thread runs the model: the caller's OpenMP workers are let
    go first (tests/cpu/test_kernels.py: what that frees)."""
    from attnlab.serving import engine as module

    calls = []
    monkeypatch.setattr(module, "hand_over_threads", lambda: calls.append(True))
    engine = Engine(_model("llama"), max_batch=2).start()
    engine.stop()
    assert calls == [True]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("family", [*FAMILIES, "alibi"])
def test_prompts_that_begin_as_earlier_ones_reuse_their_keys_and_decode_as_alone(family,
                                                                                 compiled):
    """A conversation's next turn (an earlier prompt and its answer plus more), prompts that
    share a system prompt joining at once with one that shares nothing and one that is long,
    and a repeated prompt: each prefills only what no earlier prompt had (every row
    contiguous: ALiBi's distances and the context hold), and every request's tokens equal
    decoding it alone, from scratch."""
    from attnlab.serving import engine as module

    if family == "alibi":
        torch.manual_seed(0)
        config = ModelConfig.from_preset("gpt-mini", vocab_size=40, d_model=32, n_heads=4,
                                         d_ff=64, n_decoder_layers=2, max_len=64, dropout=0.0,
                                         tie_embeddings=False, positional="alibi")
        model = build_model(config).eval()
    else:
        model = _model(family)
    step = CompiledStep(backend="eager") if compiled else None
    engine = Engine(model, max_batch=4, compiled=step).start()
    g = torch.Generator().manual_seed(2)
    system = torch.randint(4, 40, (9,), generator=g).tolist()
    first = system + [7, 8, 9]
    asks = [torch.randint(4, 40, (n,), generator=g).tolist() for n in (4, 2, 6, 30)]
    runs, prompts, news = [], [], []

    def request(prompt, n=6):
        prompts.append(prompt)
        news.append(n)
        runs.append(Collect())
        return Handle(Request(prompt, n, runs[-1]))

    def ask(prompt, n=6):
        engine.submit(request(prompt, n).request)
        return runs[-1]

    prefilled = []
    real_start = module._start_from
    try:
        module._start_from = lambda cache, entries, cached, room: (
            prefilled.append(list(cached)), real_start(cache, entries, cached, room))
        assert ask(first).done.wait(30)
        turn = first + runs[0].tokens + asks[0]  # the next turn of the same chat
        assert ask(turn).done.wait(30)
        # joining at once (as warm_up queues): two share the system prompt, one shares
        # nothing; then a long one (64 − 8 columns) with a short one: padding between the
        # short row's shared and new tokens would take the long one past the context
        for sizes in ([(system + asks[1], 6), (system + asks[2], 6), (asks[1] + asks[2], 8)],
                      [(system + asks[3] + [5] * 17, 8), (system + asks[0], 6)]):
            group = [request(p, n) for p, n in sizes]
            with engine._wake:
                engine._waiting.extend(group)
                engine._wake.notify()
            assert all(r.done.wait(30) for r in runs[-len(group):])
        assert ask(first).done.wait(30)  # the same prompt again: all but its last token
    finally:
        module._start_from = real_start
        engine.stop()
    for p, n, r in zip(prompts, news, runs, strict=True):
        assert r.finish == "length"
        assert r.tokens == generate(model, torch.tensor([p]), n)[0, len(p):].tolist(), (
            prompts.index(p), prefilled)
    assert prefilled[0] == [len(first)]  # a prompt's own tokens are kept, not its answer's
    assert prefilled[-1] == [len(first) - 1]
    # each row runs its last `width` tokens, width = the most any row must run (8 here)
    assert prefilled[1] == [11 - 8, 15 - 8, 0]
    assert prefilled[2] == [len(system), 0]  # 56 − 47; the short row runs whole
    assert engine.prompts is not None and len(engine.prompts) == 0  # stop() let them go


def test_the_prompt_cache_keeps_the_most_recent_prompts_within_its_budget():
    from attnlab.serving.prompt_cache import PromptCache

    def layers(n):  # two layers of (1, 2 heads, n, 4) float32: 2 * 2 * 2 * n * 4 * 4 bytes
        return [(torch.full((1, 2, n, 4), float(n)), torch.zeros(1, 2, n, 4))] * 2

    per_token = 2 * 2 * 2 * 4 * 4
    cache = PromptCache(10 * per_token)
    cache.store([1, 2, 3], layers(3))
    cache.store([1, 2, 9, 9], layers(4))
    assert cache.used == 7 * per_token
    assert cache.longest([1, 2, 3, 4])[0] == 3
    assert cache.longest([1, 2, 3])[0] == 2  # the last token always runs
    assert cache.longest([5])[0] == 0 and cache.longest([5])[1] is None
    length, found = cache.longest([1, 2, 9, 7])
    assert length == 3 and found[0][0][0, 0, 0, 0] == 4  # the longer entry's layers
    cache.store([4, 4, 4, 4], layers(4))  # 11 tokens > 10: the least recently used goes
    assert len(cache) == 2 and cache.used == 8 * per_token
    assert cache.longest([1, 2, 3, 5])[0] == 2  # [1, 2, 3] went ([1, 2, 9, 9] was used)
    cache.store(list(range(11)), layers(11))  # larger than the whole budget: not kept
    assert len(cache) == 2
    with pytest.raises(ValueError, match="budget"):
        PromptCache(-1)
