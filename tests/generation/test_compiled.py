"""The compiled one-token step (attnlab.generation.compiled) against the eager step: the same
logits over 20 decoding steps for GPT-2, Llama (GQA, RoPE), Mistral (a sliding window shorter
than the text) and ALiBi, on a left-padded batch, and for the encoder–decoder (the paper's
model and T5); no recompilation after the first token; and the tokens of generate, greedy
translation and beam search with and without it.

The step is compiled by inductor, as the CLI does, where its numbers are compared; the tests of
Dynamo's guards and of generate's loop trace the same graph and run it eagerly (no C++ build).
"""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, ModelConfig, Transformer
from attnlab.cpu import for_decoding
from attnlab.cpu import kernels as cpu_kernels
from attnlab.generation.compiled import (
    CompiledStep,
    DecoderSteps,
    StaticDecoding,
    capacity_for,
    encoder_decoder_token,
)
from attnlab.generation.decode import generate
from attnlab.generation.seq2seq import SOURCE_BUCKET
from attnlab.nn import StaticCache, StaticDecoderCache

SMALL = dict(vocab_size=97, d_model=32, n_heads=4, d_ff=64, n_decoder_layers=2, max_len=128)
FAMILIES = {
    "gpt2": ("gpt-mini", {}),
    "llama": ("llama-mini", {"num_kv_heads": 2}),
    "mistral": ("llama-mini", {"num_kv_heads": 2, "sliding_window": 6}),
    "alibi": ("gpt-mini", {"positional": "alibi"}),
}


def family(name: str) -> GPT:
    preset, extra = FAMILIES[name]
    torch.manual_seed(0)
    return GPT(ModelConfig.from_preset(preset, **SMALL, **extra)).eval()


def padded_prompt(rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` rows, the second left-padded by 3."""
    ids = torch.randint(1, 97, (rows, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(rows, 9, dtype=torch.bool)
    mask[1, :3] = False
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("name, backend", [("gpt2", "inductor"), ("llama", "inductor"),
                                           ("llama-bf16", "inductor"),
                                           ("llama-bf16x4", "inductor"),
                                           ("llama-int4", "inductor"),
                                           ("mistral", "eager"), ("alibi", "eager")])
def test_compiled_step_equals_the_eager_step_for_20_tokens(name, backend):
    """Prefill eagerly, then feed the same 20 tokens to the eager step (growing cache, padding
    mask) and to the compiled step (static cache, key mask): logits within 1e-5 each time.
    GPT-2 and Llama through inductor, as the CLI compiles; the window's band and ALiBi's bias
    are the graph's own logic, traced by Dynamo and run eagerly (a C++ build each would add
    tens of seconds to a cold run of the suite). ``llama-bf16``: ``for_decoding(…, "bf16")``
    on the CPU kernel, bf16 matrices and float32 activations, so the same 1e-5 holds (with bf16
    activations inductor rounds where it fuses, not where eager rounds: SmolLM2's greedy text
    parted after 22 tokens). ``llama-int4``: its linears' int4 codes (``quantize``, which casts
    the rest to bf16 where the CPU runs it natively), ``for_decoding`` with float32 activations
    around them: RoPE's tables computed again in float32, not bf16's values widened.
    ``llama-bf16x4``: 4 rows, which on a CPU with AVX512-BF16 take ``bf16_batch_matmul`` (x
    rounded to bf16) in both steps alike."""
    torch._dynamo.reset()
    model = family(name.split("-")[0])
    if "-" in name:
        if not cpu_kernels.available():
            pytest.skip("attnlab's CPU kernels are not built here")
        from attnlab.nn.quantized import Int4Linear, quantize

        if name.endswith("-int4"):
            quantize(model, bits=4)
        model = for_decoding(model, "cpu", "bf16", integer=name.endswith("-int4"),
                             rows=4 if name.endswith("x4") else 1)
        qkv = model.blocks.layers[0].self_attn.qkv
        assert (isinstance(qkv, Int4Linear) if name.endswith("-int4")
                else qkv.weight.dtype == torch.bfloat16)
        fresh = family("llama").positional
        assert torch.equal(model.positional.cos, fresh.cos)
        assert torch.equal(model.positional.sin, fresh.sin)
        assert model.embed.out_dtype == torch.float32
    rows = 4 if name.endswith("x4") else 2
    ids, mask = padded_prompt(rows)
    tokens = torch.randint(1, 97, (rows, 20), generator=torch.Generator().manual_seed(2))
    step = CompiledStep(backend=backend)
    with torch.no_grad():
        cache = model.new_cache(capacity=32, rolling=False)
        model(ids, cache=cache, attention_mask=mask)
        static = StaticDecoding(step, cache, mask, ids.shape[1], capacity_for(29, 128, 32))
        assert static.cache.capacity == 32
        grown = mask
        for t in range(tokens.shape[1]):
            token = tokens[:, t : t + 1]
            grown = torch.cat([grown, torch.ones(rows, 1, dtype=torch.bool)], 1)
            eager = model(token, cache=cache, attention_mask=grown)[:, -1].float()
            compiled = static(model, token)
            assert (compiled - eager).abs().max() <= 1e-5, (name, t)
    assert step.compiles == 1 and step.compile_seconds > 0


def test_no_recompilation_after_the_first_token():
    """Dynamo's own counters: one graph for the whole run, and no frame compiled again after
    the first token."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = family("llama")
    step = CompiledStep(backend="eager")  # Dynamo's guards decide recompiling, not inductor
    out = generate(model, torch.tensor([[5, 6, 7]]), 20, compiled=step)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1 and step.compiles == 1
    generate(model, torch.tensor([[8, 9]]), 20, compiled=step)  # another prompt, same bucket
    assert counters["stats"]["unique_graphs"] == graphs and step.compiles == 1
    assert out.shape == (1, 23)


def test_a_requests_later_tokens_run_only_the_guards_that_tell_graphs_apart(monkeypatch):
    """A request's first step runs all of Dynamo's guards; its later steps, with the same model
    and objects, only those that tell the graphs apart (``skip_guard_eval_unsafe``), and give
    the eager step's logits; another model object, a new request or a new shape: all again."""
    from attnlab.generation import compiled as module

    if not module._may_skip_guards():
        pytest.skip("this torch has no skip_guard_eval_unsafe (torch < 2.6)")
    skipped = []

    def counting():
        skipped.append(True)
        return real()

    real = module._SKIP_GUARDS
    monkeypatch.setattr(module, "_SKIP_GUARDS", counting)
    torch._dynamo.reset()
    model, other = family("llama"), family("llama")
    step = CompiledStep(backend="eager")
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        for request in range(2):
            cache = model.new_cache(capacity=16, rolling=False)
            model(ids, cache=cache)
            static = StaticDecoding(step, cache, None, 3, 16)
            for t in range(6):
                before = len(skipped)
                logits = static(other if t == 3 else model, torch.tensor([[8 + t]]))
                all_guards = t == 0 or t == 3 or t == 4  # first, another model, back again
                assert len(skipped) == before + (not all_guards), (request, t)
                eager = (other if t == 3 else model)(torch.tensor([[8 + t]]), cache=cache)
                assert (logits - eager[:, -1]).abs().max() <= 1e-5
        cache = model.new_cache(capacity=16, rolling=False)
        model(ids.expand(2, -1), cache=cache)
        static = StaticDecoding(step, cache, None, 3, 16)  # batch 2: a new shape
        before = len(skipped)  # even when the caller says "again", a new shape runs them all
        step(model, static.token, static.key_mask, static.cache, again=True)
        assert len(skipped) == before and step.compiles == 3  # (each model its own graph)


def _two_steps(model: GPT) -> tuple[CompiledStep, StaticDecoding, object]:
    """A prompt of 3 tokens, then two steps of a traced step run eagerly (the second skipping
    guards): ``(step, its StaticDecoding, the growing cache the prompt filled)``."""
    step = CompiledStep(backend="eager")
    cache = model.new_cache(capacity=16, rolling=False)
    model(torch.tensor([[5, 6, 7]]), cache=cache)
    static = StaticDecoding(step, cache, None, 3, 16)
    static(model, torch.tensor([[8]]))
    static(model, torch.tensor([[9]]))
    return step, static, cache


def test_the_guards_a_later_step_skips_are_not_checked():
    """What skipping means, and why only the loop's own later steps may: a change that only a
    skipped guard sees (a dropout module put in training mode) runs the old graph under
    ``again``, and a step that checks every guard compiles a new one (Dynamo's counters)."""
    from torch._dynamo.utils import counters

    from attnlab.generation import compiled as module

    if not module._may_skip_guards():
        pytest.skip("this torch has no skip_guard_eval_unsafe (torch < 2.6)")
    torch._dynamo.reset()
    counters.clear()
    model = family("llama")
    drop = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    with torch.no_grad():
        step, static, cache = _two_steps(model)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs == 1
        drop.train()
        static(model, torch.tensor([[10]]))  # again: the guard on .training is not checked
        assert counters["stats"]["unique_graphs"] == graphs
        static.model = None  # as a request's first step: every guard, so a new graph
        static(model, torch.tensor([[11]]))
        assert counters["stats"]["unique_graphs"] == graphs + 1


def test_a_later_step_that_no_graph_matches_checks_every_guard_instead_of_failing():
    """Under ``again`` Dynamo checks only the guards that tell graphs apart; where those match
    no graph it raises instead of compiling (``torch._dynamo.reset()`` discarded the graphs
    that the step had compiled, which a benchmark did between two models). The step then runs
    with every guard, compiling again (counted as a compile), and the logits are the eager
    step's. A key mask of the same shape but other strides is a new signature of the step's
    own (a graph compiled ahead is called unchecked): every guard, a second graph."""
    from torch._dynamo.utils import counters

    from attnlab.generation import compiled as module

    if not module._may_skip_guards():
        pytest.skip("this torch has no skip_guard_eval_unsafe (torch < 2.6)")
    torch._dynamo.reset()
    counters.clear()
    model = family("llama")
    with torch.no_grad():
        step, static, cache = _two_steps(model)
        assert counters["stats"]["unique_graphs"] == 1 and step.guard_misses == 0
        strided = torch.zeros(16, 1, dtype=torch.bool).t()  # (1, 16), strides (1, 1)
        strided[:, :6] = True
        assert strided.stride() != static.key_mask.stride()
        logits = step(model, torch.tensor([[10]]), strided, static.cache, again=True)  # slot 5
        assert step.guard_misses == 0 and counters["stats"]["unique_graphs"] == 2
        assert step.compiles == 2
        eager = model(torch.tensor([[8, 9, 10]]), cache=cache)[:, -1]  # the growing cache
        assert (logits - eager).abs().max() <= 1e-5
        static.key_mask[:, 5], static.slot = True, 6  # as if the loop had fed slot 5
        static.cache.slots += 1
        torch._dynamo.reset()  # the step's graphs are gone; its own bookkeeping is not
        logits = static(model, torch.tensor([[11]]))
        assert step.guard_misses == 1 and step.compiles == 3
        eager = model(torch.tensor([[11]]), cache=cache)[:, -1]
        assert (logits - eager).abs().max() <= 1e-5


def test_on_a_cpu_a_graph_compiled_ahead_checks_its_guards_at_a_requests_first_step():
    """Inductor on a CPU: each shape's graph is compiled ahead of its call and the step keeps
    it (Dynamo looks nothing up). A request's first step checks the kept graphs' guards, its
    later steps (``again``) none; a change the guards see (a dropout module put in training
    mode, at p = 0 so that the numbers stay the eager step's) fails them at the next request's
    first step, which compiles a second graph and counts a guard miss; back in eval mode, the
    first graph passes its check again and nothing compiles."""
    if not cpu_kernels.available():
        pytest.skip("attnlab's CPU kernels are not built here")
    model = family("llama")
    drop = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    drop.p = 0.0
    step, checked = CompiledStep(), []
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        for request in range(4):
            drop.train(request == 2)
            cache = model.new_cache(capacity=16, rolling=False)
            model(ids, cache=cache)
            static = StaticDecoding(step, cache, None, 3, 16)
            for t in range(4):
                logits = static(model, torch.tensor([[8 + t]]))
                for graph in next(iter(step._ahead.values())):  # count each graph's checks
                    if not hasattr(graph, "counted"):
                        real = graph.guard_check
                        graph.guard_check = lambda *a, real=real: checked.append(1) or real(*a)
                        graph.counted = True
                eager = model(torch.tensor([[8 + t]]), cache=cache)[:, -1]
                assert (logits - eager).abs().max() <= 1e-5, (request, t)
            assert len(step._ahead) == 1
            # 0 compiles the graph; 1's first step checks it; 2's checks it, fails (training
            # mode) and compiles another; 3's checks that one (fails), then the first (passes)
            assert (len(checked), step.compiles, step.guard_misses) == [
                (0, 1, 0), (1, 1, 0), (2, 2, 1), (4, 2, 1)][request], request
    assert len(next(iter(step._ahead.values()))) == 2


def test_where_compiling_ahead_fails_the_step_runs_through_dynamo_and_says_so():
    """Compiling ahead needs inductor's caches: with them off it fails, the step says so once
    and compiles through Dynamo's lookup instead, with the eager step's logits."""
    if not cpu_kernels.available():
        pytest.skip("attnlab's CPU kernels are not built here")
    model = family("llama")
    step = CompiledStep()
    ids = torch.tensor([[5, 6, 7]])
    with (torch._inductor.config.patch(force_disable_caches=True), torch.no_grad(),
          pytest.warns(RuntimeWarning, match="could not be compiled ahead")):
        cache = model.new_cache(capacity=16, rolling=False)
        model(ids, cache=cache)
        static = StaticDecoding(step, cache, None, 3, 16)
        for t in range(3):
            logits = static(model, torch.tensor([[8 + t]]))
            eager = model(torch.tensor([[8 + t]]), cache=cache)[:, -1]
            assert (logits - eager).abs().max() <= 1e-5, t
    assert step._ahead is None and step.compiles == 1


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_a_16_bit_kv_cache_under_float32_activations(name):
    """``for_decoding(…, kv_cache="bf16")``: the growing, rolling (Mistral's window) and static
    caches store bf16, the activations stay float32; each eager step's logits are those of the
    float32 cache to within bf16's rounding of the keys and values (2% of the largest), and
    the compiled step (inductor: the cast into the static cache, the kernel's float32 queries
    over bf16 keys) gives the eager step's greedy tokens. A dtype that is not one, and a 16-bit
    cache off the CPU kernels or for a model without one, are refused before anything changes."""
    if not cpu_kernels.available():
        pytest.skip("attnlab's CPU kernels are not built here")
    torch._dynamo.reset()
    exact = for_decoding(family(name), "cpu", "bf16")
    model = for_decoding(family(name), "cpu", "bf16", kv_cache="bf16")
    assert model.cache_dtype == torch.bfloat16 and exact.cache_dtype is None
    ids = torch.randint(1, 97, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        caches = {m: m.new_cache(capacity=16) for m in (model, exact)}
        logits = {m: [m(ids, cache=caches[m])[:, -1]] for m in caches}
        for t in range(12):  # past Mistral's window of 6
            for m in caches:
                logits[m].append(m(ids[:, t % 9:t % 9 + 1], cache=caches[m])[:, -1])
        assert caches[model][0].k.dtype == torch.bfloat16
        assert caches[exact][0].k.dtype == torch.float32
        for ours, theirs in zip(logits[model], logits[exact], strict=True):
            assert ours.dtype == torch.float32
            assert (ours - theirs).abs().max() <= 0.02 * theirs.abs().max()
        model.lm_head.weight.mul_(20)  # confident choices
        want = generate(model, ids, 16)
        got = generate(model, ids, 16, compiled=CompiledStep())
        assert torch.equal(got, want)
        cache = model.new_cache(capacity=16, rolling=False)
        model(ids, cache=cache)
        static = StaticDecoding(CompiledStep(backend="eager"), cache, None, 9, 32)
        static(model, ids[:, :1])
        assert static.cache[0].k.dtype == torch.bfloat16
    from attnlab.errors import BadInput

    for bad in (dict(kv_cache="int8"), dict(kv_cache="bf16", device="meta")):
        with pytest.raises(BadInput, match="kv_cache|KV cache"):
            for_decoding(family(name), **{"device": "cpu", **bad})
    with pytest.raises(BadInput, match="decoder-only"):
        for_decoding(Transformer(ModelConfig.from_preset("tiny", **SMALL)), "cpu",
                     kv_cache="bf16")


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_generate_with_the_compiled_step_gives_greedy_tokens(name):
    """The left-padded batch and a single row, 24 new tokens (past the window): the same
    tokens as eager greedy decoding (the tiny model's margins are far above 1e-5)."""
    torch._dynamo.reset()
    model = family(name)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # confident choices
    ids, mask = padded_prompt()
    step = CompiledStep(backend="eager")  # the graph's numbers: the test above, by inductor
    for args in ((ids, mask), (ids[:1], None)):
        want = generate(model, args[0], 24, attention_mask=args[1])
        got = generate(model, args[0], 24, attention_mask=args[1], compiled=step)
        assert torch.equal(got, want)


def test_a_float_model_compiles_before_anything_asked_for_the_cpu_kernels():
    """The one-query attention asks whether attnlab's kernels are built; nothing may be built
    inside a trace. In a fresh process: a user's own torch.compile gets PyTorch's kernel, and
    CompiledStep settles the question before it compiles (once failed: a lock in the trace)."""
    import subprocess
    import sys

    script = """
import torch
from attnlab import GPT, ModelConfig
from attnlab.generation.compiled import CompiledStep
from attnlab.cpu import for_decoding
from attnlab.generation.decode import generate
from attnlab.cpu import kernels as cpu_kernels
from attnlab.nn.attention import scaled_dot_product_attention
q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
f = torch.compile(scaled_dot_product_attention, backend="eager", fullgraph=True)
assert torch.allclose(f(q, k, v), scaled_dot_product_attention(q, k, v), atol=1e-6)
torch.manual_seed(0)
model = GPT(ModelConfig.from_preset("llama-mini", vocab_size=97, d_model=32, n_heads=4,
                                    d_ff=64, n_decoder_layers=2)).eval()
ids = torch.tensor([[1, 2, 3]])
cpu_kernels._LOADED = None
got = generate(model, ids, 6, compiled=CompiledStep(backend="eager"))
assert cpu_kernels._LOADED is not None
assert torch.equal(got, generate(model, ids, 6))
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_past_the_context_generate_stays_eager():
    """nanoGPT's crop needs the eager path: a run longer than the context never compiles."""
    model = family("gpt2")
    step = CompiledStep(backend="eager")
    out = generate(model, torch.tensor([[1, 2, 3]]), 130, compiled=step)
    assert out.shape == (1, 133) and step.compiles == 0


def test_capacity_buckets_and_the_static_cache():
    assert [capacity_for(n, None) for n in (1, 256, 257)] == [256, 256, 512]
    assert capacity_for(300, 300) == 300  # never past the context
    k = torch.arange(6.0).view(1, 1, 3, 2)
    from attnlab.nn import SelfAttentionCache

    grown = SelfAttentionCache(1, capacity=3)
    grown[0].append(k, k)
    static = StaticCache.from_cache(grown, 5)
    assert static.capacity == 5 and int(static.slots) == 3 and static.length == 4
    assert torch.equal(static[0].k[:, :, :3], k) and static[0].k[:, :, 3:].abs().sum() == 0
    new = torch.full((1, 1, 1, 2), 9.0)
    keys, _ = static[0].append(new, new)
    assert keys.shape == (1, 1, 5, 2) and keys[0, 0, 3].tolist() == [9.0, 9.0]
    with pytest.raises(ValueError, match="cannot hold 3 positions"):
        StaticCache.from_cache(grown, 2)


# --- the encoder–decoder ---------------------------------------------------------------------

ENCODER_DECODERS = {  # the paper's model (Marian-style: sinusoidal PE) and T5 (relative bias)
    "transformer": ("tiny", {}),
    "t5": ("t5-small", {"head_dim": 8, "relative_buckets": 8, "relative_max_distance": 16}),
}


def encoder_decoder(name: str) -> Transformer:
    preset, extra = ENCODER_DECODERS[name]
    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, vocab_size=53, d_model=32, n_heads=4, d_ff=64,
                                     n_encoder_layers=2, n_decoder_layers=2, max_len=64,
                                     dropout=0.0, **extra)
    return Transformer(config).eval()


def sources() -> torch.Tensor:
    """Three sentences, the last padded by 2."""
    src = torch.randint(4, 53, (3, 7), generator=torch.Generator().manual_seed(1))
    src[2, 5:] = 0
    return src


@pytest.mark.parametrize("name, backend", [("transformer", "inductor"), ("t5", "eager")])
def test_encoder_decoder_compiled_step_equals_the_eager_step_for_20_tokens(name, backend):
    """The same 21 target tokens (bos, then 20) through the eager decoder (growing cache) and
    through the compiled step (static cache, the position a tensor): logits within 1e-5 each
    time. 20 steps carry T5's relative bias past its exact buckets into the logarithmic ones."""
    torch._dynamo.reset()
    model = encoder_decoder(name)
    src = sources()
    targets = torch.randint(4, 53, (3, 21), generator=torch.Generator().manual_seed(2))
    targets[:, 0] = model.config.bos_id
    step = CompiledStep(backend=backend, function=encoder_decoder_token)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        eager = DecoderSteps(model, memory, src_mask, 22)
        compiled = DecoderSteps(model, memory, src_mask, 22, compiled=step)
        for t in range(targets.shape[1]):
            token = targets[:, t : t + 1]
            assert (compiled(token).float() - eager(token).float()).abs().max() <= 1e-5, t
        assert isinstance(compiled.cache, StaticDecoderCache) and compiled.cache.capacity == 32
    assert step.compiles == 1 and step.compile_seconds > 0


def searches_equal_eager(model: Transformer, src: torch.Tensor, step: CompiledStep):
    """Greedy and beam search (k = 4) with ``step``: the eager search's tokens, and its logits
    and scores within 1e-5; returns the beam search's tokens."""
    from attnlab.generation.beam import beam_search
    from attnlab.generation.seq2seq import greedy_decode

    want, want_logits = greedy_decode(model, src, max_len=24, return_logits=True)
    got, got_logits = greedy_decode(model, src, max_len=24, return_logits=True, compiled=step)
    assert torch.equal(got, want)
    assert (got_logits.float() - want_logits.float()).abs().max() <= 1e-5
    want, want_scores = beam_search(model, src, 4, max_len=24, return_scores=True)
    got, got_scores = beam_search(model, src, 4, max_len=24, return_scores=True, compiled=step)
    assert torch.equal(got, want)
    assert (got_scores - want_scores).abs().max() <= 1e-5
    return want


@pytest.mark.parametrize("name", ["transformer", "t5"])
def test_encoder_decoder_greedy_and_beam_with_the_compiled_step(name, monkeypatch):
    """Greedy and beam search (k = 4: the static cache's rows reordered in place every step)
    give the eager search's tokens and scores; one graph per batch shape, none compiled again
    after the first token (Dynamo's counters); the later steps skip the guards that do not
    tell graphs apart."""
    from torch._dynamo.utils import counters

    from attnlab.generation import compiled as module
    from attnlab.generation.beam import beam_search

    skipped = []
    if module._may_skip_guards():
        real = module._SKIP_GUARDS
        monkeypatch.setattr(module, "_SKIP_GUARDS", lambda: skipped.append(1) or real())
    torch._dynamo.reset()
    counters.clear()
    model = encoder_decoder(name)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)  # confident choices, a long way from ties
    src = sources()
    step = CompiledStep(backend="eager", function=encoder_decoder_token)
    want = searches_equal_eager(model, src, step)
    assert step.compiles == 2 and counters["stats"]["unique_graphs"] == 2  # batch 3 and 3 · 4
    assert len(skipped) > 20 or not module._may_skip_guards()  # 42 here: greedy, then beam
    # translate pads the source to a bucket when it compiles: the same search
    padded = torch.nn.functional.pad(src, (0, SOURCE_BUCKET - src.shape[1]))
    assert torch.equal(beam_search(model, padded, 4, max_len=24, compiled=step), want)
    assert step.compiles == 3  # a new source length, a new graph


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the step as a CUDA graph)")


@needs_cuda
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_on_cuda_the_step_is_one_cuda_graph_equal_to_eager(name):
    """On a GPU, inductor records the step as a CUDA graph ("reduce-overhead"): the same
    logits as the eager step over 20 tokens (fp32, TF32 off, 1e-5), no step skipped CUDA
    graphs (the caches' storage is a static address, not a mutated input), one Dynamo graph,
    and a second request (a new cache, new addresses) records again without recompiling."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = family(name).cuda()
    ids, mask = (t.cuda() for t in padded_prompt())
    tokens = torch.randint(1, 97, (2, 20), generator=torch.Generator().manual_seed(2)).cuda()
    step = CompiledStep()
    worst = 0.0
    with torch.no_grad():
        cache = model.new_cache(capacity=32, rolling=False)
        model(ids, cache=cache, attention_mask=mask)
        static = StaticDecoding(step, cache, mask, ids.shape[1], capacity_for(29, 128, 32))
        grown = mask
        for t in range(tokens.shape[1]):
            token = tokens[:, t : t + 1]
            grown = torch.cat([grown, grown.new_ones(2, 1)], 1)
            eager = model(token, cache=cache, attention_mask=grown)[:, -1].float()
            worst = max(worst, (static(model, token) - eager).abs().max().item())
    print(f"{name}: largest difference from eager over 20 tokens {worst:.2e}")
    assert worst <= 1e-5
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["stats"]["unique_graphs"] == 1 and step.compiles == 1
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # confident choices: tokens compared, not near-ties
    want = generate(model, ids[1:, 3:], 24)
    assert torch.equal(generate(model, ids[1:, 3:], 24, compiled=step), want)
    assert counters["stats"]["unique_graphs"] == 2  # batch 1: one more graph, then no more
    assert torch.equal(generate(model, ids[1:, 3:], 24, compiled=step), want)
    assert counters["stats"]["unique_graphs"] == 2 and step.compiles == 2
    assert counters["inductor"]["cudagraph_skips"] == 0


@needs_cuda
def test_on_cuda_encoder_decoder_greedy_and_beam_run_as_cuda_graphs():
    """The encoder–decoder's step as a CUDA graph: greedy and beam search (rows reordered in
    place between replays) give the eager search's tokens and scores."""
    from torch._dynamo.utils import counters


    torch._dynamo.reset()
    counters.clear()
    model = encoder_decoder("transformer").cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
    src = sources().cuda()
    step = CompiledStep(function=encoder_decoder_token)
    searches_equal_eager(model, src, step)
    assert counters["inductor"]["cudagraph_skips"] == 0
