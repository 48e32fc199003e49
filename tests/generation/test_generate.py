"""Decoder-only generation: cache equivalence, left padding, seeded sampling (the sampling
step itself against transformers: test_sampling.py)."""

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.cpu import kernels as cpu_kernels
from attnlab.cpu.linear import KernelLinear
from attnlab.generation import decoding_layout_, generate


def model(preset):
    torch.manual_seed(0)
    return GPT(ModelConfig.from_preset(preset)).eval()


def uncached_greedy(m, ids, n):
    for _ in range(n):
        ids = torch.cat([ids, m(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])  # learned positions, RoPE
def test_cached_generation_equals_uncached(preset):
    m = model(preset)
    prompt = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(generate(m, prompt, 15), uncached_greedy(m, prompt, 15))


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])
def test_left_padded_batch_equals_each_prompt_alone(preset):
    m = model(preset)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 256, (n,), generator=g) for n in (3, 8, 5)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = p
        mask[row, width - len(p):] = 1
    batched = generate(m, ids, 10, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = generate(m, p[None], 10)
        assert torch.equal(batched[row, width:], alone[0, len(p):])


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    m = model("gpt-mini")
    prompt = torch.randint(0, 256, (2, 4), generator=torch.Generator().manual_seed(0))

    def sample(seed):
        return generate(m, prompt, 12, temperature=1.0, top_k=50, top_p=0.9,
                        generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))


def test_eos_stops_and_pads():
    m = model("gpt-mini")
    prompt = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(0))
    first = generate(m, prompt, 1)[0, -1].item()  # make the first new token the eos
    out = generate(m, prompt, 10, eos_id=first)
    assert out.shape[1] == 5 and out[0, -1].item() == first


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_k=0), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty")])
def test_bad_decoding_settings_are_named(kwargs, name):
    m = model("gpt-mini")
    args = dict(max_new_tokens=3, temperature=1.0) | kwargs
    with pytest.raises(ValueError, match=f"^{name} must be"):
        generate(m, torch.ones(1, 4, dtype=torch.long), **args)
    with pytest.raises(ValueError, match="prompt must be"):
        generate(m, torch.ones(1, 0, dtype=torch.long), 3)


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])
def test_decoding_layout_changes_memory_not_values(preset, tmp_path):
    from attnlab.storage import load_model_dir, save_model_dir
    from attnlab.training.trainer import TrainConfig, build_optimizer

    m = model(preset)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, tokens = m(ids), generate(m, ids, 12)
    shapes = {k: v.shape for k, v in m.state_dict().items()}
    decoding_layout_(m)
    w = m.blocks.layers[0].ffn.w1.weight
    if cpu_kernels.available():  # attnlab's few-row kernel, over the row-major matrix
        assert isinstance(m.blocks.layers[0].ffn.w1, KernelLinear) and w.is_contiguous()
    else:  # (out, in), stored input-major for PyTorch's one-row product
        assert not w.is_contiguous() and w.t().is_contiguous()
    assert m.config.tie_embeddings == (m.lm_head.weight is m.embed.weight)
    assert {k: v.shape for k, v in m.state_dict().items()} == shapes
    with torch.no_grad():
        assert torch.allclose(m(ids), before, atol=1e-5)
    assert torch.equal(generate(m, ids, 12), tokens)
    save_model_dir(tmp_path / "saved", m, m.config, {})
    with torch.no_grad():
        # (laid out again: the kernel and PyTorch's GEMM round differently)
        loaded = decoding_layout_(load_model_dir(tmp_path / "saved")[0])
        assert torch.equal(loaded(ids), m(ids))
    m.train()  # still trains: gradients take the parameters' layout
    opt = build_optimizer(m, TrainConfig(optimizer="adamw", weight_decay=0.1), 1e-2)
    m(ids).logsumexp(-1).mean().backward()
    old = w.detach().clone()
    opt.step()
    assert not torch.equal(w, old)
    with torch.no_grad():
        trained = m(ids)
    half = decoding_layout_(m.to(torch.bfloat16))  # bf16 reads row-major faster: restored
    assert half.blocks.layers[0].ffn.w1.weight.is_contiguous()
    with torch.no_grad():  # (18 rows: PyTorch's GEMM)
        assert torch.allclose(half(ids).float(), trained, atol=0.1)
    single = decoding_layout_(m.float().eval())
    with torch.no_grad():
        expected = single(ids)
    batch = decoding_layout_(single, rows=8)  # a batch of rows reads row-major faster
    assert batch.blocks.layers[0].ffn.w1.weight.is_contiguous()
    with torch.no_grad():
        assert torch.allclose(batch(ids), expected, atol=1e-5)


def assert_picks_of_cropped_context(m, out, prompt_len, block):
    """Each generated token is the argmax nanoGPT's loop computes from the last ``block``
    tokens alone, uncached (to float ties: its logit within 1e-4 of the largest)."""
    with torch.no_grad():
        for t in range(prompt_len, out.shape[1]):
            logits = m(out[:, max(0, t - block):t])[:, -1]
            picked = logits.gather(-1, out[:, t:t + 1]).squeeze(-1)
            assert (picked >= logits.max(-1).values - 1e-4).all(), t


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])  # learned positions, RoPE
def test_generation_past_the_trained_block_crops_the_context(preset, monkeypatch):
    """A block-32 model generates 300 new tokens; no position it is fed exceeds 31, and every
    token is the one nanoGPT's crop-to-block loop picks."""
    torch.manual_seed(0)
    m = GPT(ModelConfig.from_preset(preset, block_size=32, d_model=32, n_heads=2,
                                    n_decoder_layers=2)).eval()
    seen = []
    embed = m.positional.embed

    def recording(x, positions):
        seen.append(int(positions.max()))
        return embed(x, positions)

    monkeypatch.setattr(m.positional, "embed", recording)
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(0))
    out = generate(m, prompt, 300)
    assert out.shape == (2, 305) and max(seen) == 31
    assert_picks_of_cropped_context(m, out, 5, 32)
    long_prompt = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    seen.clear()
    out = generate(m, long_prompt, 5)
    assert max(seen) == 31
    assert_picks_of_cropped_context(m, out, 40, 32)
