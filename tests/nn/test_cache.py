"""The rolling KV cache of sliding-window attention against attention without a cache."""

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.nn import RollingKVCache, sliding_window_mask


def test_the_band_by_hand():
    band = sliding_window_mask(torch.arange(5), torch.arange(5), 3)[0, 0]
    assert band.int().tolist() == [[1, 0, 0, 0, 0],
                                   [1, 1, 0, 0, 0],
                                   [1, 1, 1, 0, 0],
                                   [0, 1, 1, 1, 0],
                                   [0, 0, 1, 1, 1]]


def test_the_rolling_cache_holds_window_entries_in_slots_p_mod_w():
    cache = RollingKVCache(window=4)
    for p in range(7):  # key p holds the number p
        x = torch.full((1, 1, 1, 2), float(p))
        index = cache.key_index(1)
        k, _ = cache.append(x, x)
        assert k[0, 0, :, 0].tolist() == index.tolist()  # it says where each key came from
    assert cache.k.shape[2] == 4 and cache.length == 7
    assert cache.k[0, 0, :, 0].tolist() == [4, 5, 6, 3]  # slot p mod 4


@pytest.fixture(scope="module")
def mistral_like():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("llama-mini", sliding_window=5, n_decoder_layers=2)
    return GPT(config).eval()


@pytest.mark.parametrize("chunks", [[1] * 17, [6] + [1] * 11, [3, 7, 1, 6], [12, 5]])
def test_decoding_with_the_rolling_cache_equals_attention_without_one(mistral_like, chunks):
    """Prompts longer and shorter than W, steps of one and of several tokens."""
    ids = torch.randint(0, 256, (2, sum(chunks)), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = mistral_like(ids)
        cache = mistral_like.new_cache()
        parts, start = [], 0
        for n in chunks:
            parts.append(mistral_like(ids[:, start : start + n], cache=cache))
            start += n
    assert (torch.cat(parts, 1) - whole).abs().max() <= 1e-5
    assert all(layer.k.shape[2] == 5 for layer in cache)  # never more than W entries


def test_left_padding_with_the_rolling_cache(mistral_like):
    ids = torch.randint(1, 256, (2, 14), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        whole = mistral_like(ids, attention_mask=mask)
        cache = mistral_like.new_cache()
        first = mistral_like(ids[:, :8], cache=cache, attention_mask=mask[:, :8])
        rest = [mistral_like(ids[:, t : t + 1], cache=cache, attention_mask=mask[:, : t + 1])
                for t in range(8, 14)]
    got = torch.cat([first, *rest], 1)
    assert (got - whole)[mask].abs().max() <= 1e-5


def test_padding_between_tokens_needs_a_full_cache(mistral_like):
    """A rolling cache would keep fewer than W real tokens of such a row: refused, and the
    full cache gives the uncached numbers."""
    ids = torch.randint(1, 256, (2, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 4:7] = False  # three pads inside the first row
    with torch.no_grad():
        whole = mistral_like(ids, attention_mask=mask)
        with pytest.raises(ValueError, match="needs left padding only"):
            mistral_like(ids, cache=mistral_like.new_cache(), attention_mask=mask)
        cache = mistral_like.new_cache(rolling=False)
        first = mistral_like(ids[:, :9], cache=cache, attention_mask=mask[:, :9])
        rest = mistral_like(ids[:, 9:], cache=cache, attention_mask=mask)
    assert (torch.cat([first, rest], 1) - whole)[mask].abs().max() <= 1e-5


def test_truncate_forgets_the_last_positions_of_a_growing_cache():
    """Positions 0..6 cached, truncated to 4: the next append lands at 4, over the stale ones,
    and the cache returns positions 0..3 and the new ones only."""
    from attnlab.nn import KVCache

    cache = KVCache(capacity=4)  # grows once on the way: truncation survives it
    for p in range(7):
        x = torch.full((1, 1, 1, 2), float(p))
        cache.append(x, x)
    cache.truncate(4)
    assert cache.length == 4
    k, v = cache.append(torch.full((1, 1, 2, 2), 9.0), torch.full((1, 1, 2, 2), 9.0))
    assert k[0, 0, :, 0].tolist() == [0, 1, 2, 3, 9, 9] and torch.equal(k, v)
    with pytest.raises(ValueError, match="cannot truncate a cache of 6 positions to 7"):
        cache.truncate(7)
    with pytest.raises(ValueError, match="static"):
        KVCache(static=True).truncate(0)


def test_rejected_tokens_leave_no_trace_after_truncate(mistral_like):
    """Speculative decoding's rollback through a whole decoder (the sliding window decoded with
    the growing cache and the band mask): 10 tokens, 4 wrong guesses, truncate back to 10,
    then the right tokens give the logits of a run without a cache."""
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = mistral_like(ids)
        cache = mistral_like.new_cache(rolling=False)
        first = mistral_like(ids[:, :10], cache=cache)
        mistral_like((ids[:, 10:14] + 1) % 256, cache=cache)  # rejected guesses
        cache.truncate(10)
        assert cache.length == 10 and all(layer.length == 10 for layer in cache)
        rest = mistral_like(ids[:, 10:], cache=cache)
    assert (torch.cat([first, rest], 1) - whole).abs().max() <= 1e-5


def test_a_rolling_cache_rolls_back_only_before_reusing_a_slot():
    cache = RollingKVCache(window=4)
    x = torch.zeros(1, 1, 3, 2)
    cache.append(x, x)
    cache.truncate(2)  # 3 positions seen, no slot reused yet
    cache.append(x, x)  # 5 positions: slot 0 now holds position 4
    with pytest.raises(ValueError, match="cannot roll back from 5 positions to 3"):
        cache.truncate(3)
    cache.truncate(5)  # forgetting nothing is always possible
