"""Sampled translation: each token is ``generate``'s sampling step over the encoder–decoder's
logits, drawn with the caller's generator.

The reference recomputes every step's logits with a full teacher-forced pass (no cache, none of
seq2seq.py's loop), bans pad, turns them into transformers' sampling distribution
(:func:`tests.sampling.reference_distribution`: its Temperature, TopK and TopP processors) and
draws with ``torch.multinomial`` and a generator of the same seed, one draw for every row a
step, as ``generate`` draws."""

from __future__ import annotations

import pytest
import torch

from attnlab import ModelConfig, Transformer
from attnlab.errors import BadInput
from attnlab.generation.seq2seq import greedy_decode, sample_decode, translate
from tests.sampling import reference_distribution

SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5),
            dict(temperature=1.5, top_p=0.8), dict(temperature=0.9, top_k=8, top_p=0.9)]
MAX_LEN = 16


@pytest.fixture(scope="module")
def model() -> Transformer:
    """A random tiny encoder–decoder over 24 tokens whose eos (3) is likely enough that
    sampled rows end at different steps, and pad (0) likely enough that a sampler that let it
    through would draw it."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("tiny", vocab_size=24, dropout=0.0,
                                                output_bias=True)).eval()
    with torch.no_grad():
        model.lm_head.bias[model.config.eos_id] += 2.5
        model.lm_head.bias[model.config.pad_id] += 3.0
    return model


def sources() -> torch.Tensor:
    src = torch.randint(4, 24, (5, 7), generator=torch.Generator().manual_seed(1))
    src[1, 4:], src[3, 2:] = 0, 0  # padded
    return src


def reference(model, src, seed, temperature, top_k=None, top_p=None) -> torch.Tensor:
    cfg = model.config
    generator = torch.Generator().manual_seed(seed)
    out = torch.full((len(src), 1), cfg.bos_id)
    done = torch.zeros(len(src), dtype=torch.bool)
    for _ in range(MAX_LEN - 1):
        with torch.no_grad():
            logits = model(src, out)[:, -1]
        logits[:, cfg.pad_id] = float("-inf")
        probs = reference_distribution(logits, None, temperature, top_k, top_p)
        token = torch.multinomial(probs, 1, generator=generator)[:, 0].masked_fill(done,
                                                                                   cfg.pad_id)
        out = torch.cat([out, token[:, None]], 1)
        done |= token == cfg.eos_id
        if done.all():
            break
    return out


def name(setting: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


@pytest.mark.parametrize("setting", SETTINGS, ids=name)
def test_sampled_tokens_are_the_reference_draws(model, setting):
    src = sources()
    got = sample_decode(model, src, generator=torch.Generator().manual_seed(7), max_len=MAX_LEN,
                        **setting)
    assert torch.equal(got, reference(model, src, 7, **setting))
    ended = [row.index(3) for row in got.tolist() if 3 in row]
    assert len(set(ended)) >= 2  # rows end at different steps: the filler after eos is tested


def test_the_same_seed_draws_the_same_translation_and_another_seed_another(model):
    src = sources()

    def draw(seed):
        return sample_decode(model, src, 1.0, generator=torch.Generator().manual_seed(seed),
                             max_len=MAX_LEN)

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_temperature_zero_is_greedy_decoding(model):
    src = sources()
    assert torch.equal(sample_decode(model, src, 0.0, top_k=2, max_len=MAX_LEN),
                       greedy_decode(model, src, max_len=MAX_LEN))


class Chars:
    """A tokenizer of one character a token ("a" = 4, ...), enough for ``translate``."""

    def encode(self, text, add_eos=False):
        return [4 + ord(c) - ord("a") for c in text] + ([3] if add_eos else [])

    def decode(self, ids):
        return "".join(chr(ord("a") + i - 4) for i in ids if i >= 4)


def test_translate_samples_each_length_batch_with_the_generator(model):
    """``translate`` batches sentences by length (here one batch) and samples with
    ``sample_decode``'s draws; beam search with sampling is refused."""
    sentences = ["abc", "hello", "tea"]
    got = translate(model, Chars(), Chars(), sentences, temperature=0.8, top_k=6,
                    generator=torch.Generator().manual_seed(2))
    order = sorted(range(3), key=lambda i: len(Chars().encode(sentences[i], True)))
    ids = [Chars().encode(sentences[i], True) for i in order]
    width = max(map(len, ids))
    src = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    tokens = sample_decode(model, src, 0.8, top_k=6, generator=torch.Generator().manual_seed(2),
                           max_len=width + 50)
    want = [""] * 3
    for i, row in zip(order, tokens.tolist(), strict=True):
        want[i] = Chars().decode(row)
    assert got == want
    with pytest.raises(BadInput, match="beam"):
        translate(model, Chars(), Chars(), sentences, beam_size=4, temperature=0.8)
    with pytest.raises(BadInput, match="top_p"):
        translate(model, Chars(), Chars(), sentences, temperature=0.8, top_p=1.5)
