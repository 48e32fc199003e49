"""The compiled one-token step (attnlab.generation.compiled) against the eager step: the same
logits over 20 decoding steps for GPT-2, Llama (GQA, RoPE), Mistral (a sliding window shorter
than the text) and ALiBi, on a left-padded batch; no recompilation after the first token; and
generate's tokens with and without it.

The step is compiled by inductor, as the CLI does, where its numbers are compared; the tests of
Dynamo's guards and of generate's loop trace the same graph and run it eagerly (no C++ build).
"""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.generation.compiled import CompiledStep, StaticDecoding, capacity_for
from attnlab.generation.decoder_only import generate
from attnlab.nn import StaticCache

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


def padded_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows, the second left-padded by 3."""
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("name, backend", [("gpt2", "inductor"), ("llama", "inductor"),
                                           ("mistral", "eager"), ("alibi", "eager")])
def test_compiled_step_equals_the_eager_step_for_20_tokens(name, backend):
    """Prefill eagerly, then feed the same 20 tokens to the eager step (growing cache, padding
    mask) and to the compiled step (static cache, key mask): logits within 1e-5 each time.
    GPT-2 and Llama through inductor, as the CLI compiles; the window's band and ALiBi's bias
    are the graph's own logic, traced by Dynamo and run eagerly (a C++ build each would add
    tens of seconds to a cold run of the suite)."""
    torch._dynamo.reset()
    model = family(name)
    ids, mask = padded_prompt()
    tokens = torch.randint(1, 97, (2, 20), generator=torch.Generator().manual_seed(2))
    step = CompiledStep(backend=backend)
    with torch.no_grad():
        cache = model.new_cache(capacity=32, rolling=False)
        model(ids, cache=cache, attention_mask=mask)
        static = StaticDecoding(step, cache, mask, ids.shape[1], capacity_for(29, 128, 32))
        assert static.cache.capacity == 32
        grown = mask
        for t in range(tokens.shape[1]):
            token = tokens[:, t : t + 1]
            grown = torch.cat([grown, torch.ones(2, 1, dtype=torch.bool)], 1)
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
