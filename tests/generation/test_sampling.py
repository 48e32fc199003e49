"""The sampling step (``decode.py``: ``penalise_repeats``, ``filter_logits``, ``next_tokens``) and
``generate``'s draws against transformers' logits processors on the same logits.

Each check compares the exact set of tokens kept, the probabilities (within 1e-6) and the
seeded draws with ``multinomial(softmax(filter(penalised logits / T)))`` where ``filter`` is
transformers' TopK and TopP warpers (:mod:`tests.sampling`). attnlab offers no min-p.
A temperature ignored or multiplied, a top-k that keeps only the argmax, a top-p that drops the
token crossing p (or keeps one past an exact boundary) and an inverted repetition penalty each
fail here.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.generation import filter_logits, generate, next_tokens, penalise_repeats
from tests.sampling import constant_logits_model, reference_distribution, reference_draws

VOCAB = 40
SETTINGS = [  # each filter alone, then together; penalties above and below 1
    dict(temperature=0.6), dict(temperature=1.8), dict(top_k=1), dict(top_k=7),
    dict(top_p=0.3), dict(top_p=0.9), dict(repetition_penalty=1.5),
    dict(repetition_penalty=0.8), dict(temperature=0.7, top_k=10, top_p=0.8),
    dict(temperature=1.3, top_k=12, top_p=0.95, repetition_penalty=1.4),
]


def name(setting: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


def logits_and_seen(rows: int, seed: int = 0):
    """Logits of both signs (the penalty divides the positive, multiplies the negative) and
    ``seen`` ids with repeats."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * 3, torch.randint(0, VOCAB, (rows, 12),
                                                                     generator=g)


def ours(logits, seen, temperature=1.0, top_k=None, top_p=None, repetition_penalty=1.0):
    """The distribution ``next_tokens`` samples from, from attnlab's two functions."""
    z = logits if seen is None else penalise_repeats(logits, seen, repetition_penalty)
    return filter_logits(z / temperature, top_k, top_p).softmax(-1)


def kept(probs) -> list[set[int]]:
    return [set(row.nonzero().flatten().tolist()) for row in probs]


@pytest.mark.parametrize("setting", SETTINGS, ids=name)
def test_the_distribution_is_transformers_with_the_same_settings(setting):
    logits, seen = logits_and_seen(16)
    got, want = ours(logits, seen, **setting), reference_distribution(logits, seen, **setting)
    assert kept(got) == kept(want)
    assert (got - want).abs().max() <= 1e-6


@pytest.mark.parametrize("setting", SETTINGS, ids=name)
def test_next_tokens_draws_what_multinomial_draws_from_the_reference(setting):
    """The same seeded generator: ``next_tokens`` draws, row for row, what
    ``multinomial(reference distribution)`` draws."""
    logits, seen = logits_and_seen(64, seed=1)
    setting = dict(temperature=1.0) | setting
    for seed in range(3):
        got = next_tokens(logits, generator=torch.Generator().manual_seed(seed), seen=seen,
                          **setting)
        want = torch.multinomial(reference_distribution(logits, seen, **setting), 1,
                                 generator=torch.Generator().manual_seed(seed)).squeeze(-1)
        assert torch.equal(got, want), seed


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = (torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(2)) * 2).round()
    for k in range(1, VOCAB + 1):
        assert kept(ours(logits, None, top_k=k)) == kept(reference_distribution(logits, top_k=k))
    row = torch.tensor([[3.0, 1.0, 3.0, 0.0, 3.0]])
    assert kept(filter_logits(row, top_k=2).softmax(-1)) == [{0, 2, 4}]


def test_top_p_keeps_the_smallest_set_that_reaches_p_on_either_side_of_each_boundary():
    """Just below the mass of the j+1 most likely tokens, those j+1 are kept; just above,
    j+2: the token whose probability crosses p is always kept."""
    logits = torch.randn(6, 12, generator=torch.Generator().manual_seed(3)) * 1.5
    probs = logits.softmax(-1).double()
    assert probs.min() > 1e-4  # so that ±1e-5 stays between two boundaries
    for row in range(len(logits)):
        order = probs[row].argsort(descending=True)
        reached = probs[row][order].cumsum(0)
        for j in range(len(order) - 1):
            for top_p, n in ((reached[j].item() - 1e-5, j + 1), (reached[j].item() + 1e-5, j + 2)):
                got = kept(ours(logits[row : row + 1], None, top_p=top_p))
                assert got == kept(reference_distribution(logits[row : row + 1], top_p=top_p))
                assert got == [set(order[:n].tolist())], (row, j, top_p)


def test_top_p_at_an_exact_boundary_and_inside_ties():
    """Four tied tokens of probability 1/4 exactly: p = 1/4, 1/2, 3/4 keep 1, 2, 3 of them
    (the set reaching p exactly suffices), each then 1/n. Where a tie straddles the edge of the
    nucleus, which of the tied tokens stay is arbitrary (attnlab keeps the lowest ids,
    transformers the highest): the number kept and the kept logits must agree."""
    tied = torch.tensor([[0.0, -1e9, 0.0, 0.0, -1e9, 0.0]])
    for n in (1, 2, 3):
        got = ours(tied, None, top_p=n / 4)
        want = reference_distribution(tied, top_p=n / 4)
        assert len(kept(got)[0]) == len(kept(want)[0]) == n
        assert kept(got)[0] <= {0, 2, 3, 5} and (got[got > 0] - 1 / n).abs().max() <= 1e-6
    logits = (torch.randn(32, 10, generator=torch.Generator().manual_seed(4)) * 1.5).round()
    for top_p in (0.2, 0.5, 0.7, 0.9, 0.97):
        got, want = ours(logits, None, top_p=top_p), reference_distribution(logits, top_p=top_p)
        for row in range(len(logits)):
            g, w = got[row] > 0, want[row] > 0
            assert torch.equal(logits[row][g].sort().values, logits[row][w].sort().values)
            assert (got[row][g].sort().values - want[row][w].sort().values).abs().max() <= 1e-6


def test_top_p_cuts_a_tie_at_the_lowest_ids_whatever_the_vocabulary_size():
    """Ties inside the nucleus's edge keep the lowest ids (a stable sort): the rule the live
    page filters with. An unstable sort keeps other ids once the vocabulary is large."""
    for vocab in (8, 100, 5000, 50_000):
        tied = torch.zeros(1, vocab)
        for top_p in (0.3, 0.5, 0.9):
            n = int(torch.tensor(top_p, dtype=torch.float32) * vocab)  # the mass 1/vocab each
            got = (filter_logits(tied, top_p=top_p) > float("-inf"))[0].nonzero().flatten()
            assert got.tolist() == list(range(len(got))), (vocab, top_p)
            assert abs(len(got) - n) <= 1, (vocab, top_p, len(got))


@pytest.mark.parametrize("temperature", [float("inf"), 1e-50, float("nan"), -1.0])
def test_a_temperature_softmax_cannot_take_is_refused(temperature):
    """logits / T overflows below MIN_TEMPERATURE and is NaN at T = ∞: refused, not a crash."""
    from attnlab.errors import BadInput
    from attnlab.generation.decode import check_decoding

    with pytest.raises(BadInput, match="temperature"):
        check_decoding(torch.ones(1, 2, dtype=torch.long), 1, temperature, None, None, 1.0)
    check_decoding(torch.ones(1, 2, dtype=torch.long), 1, 1e-6, None, None, 1.0)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if "temperature" in s
                                     or "repetition_penalty" in s], ids=name)
def test_generate_draws_what_the_reference_draws_from_the_models_logits(setting):
    """A model whose every step's logits are known: ``generate``'s tokens (two rows, each
    penalising its own prompt and output) are the reference's seeded draws."""
    z = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    model = constant_logits_model(z)
    prompts = [[5, 6, 7], [9, 9, 1]]
    with torch.no_grad():
        assert torch.equal(model(torch.tensor(prompts))[:, -1], z.expand(2, -1))
    setting = dict(temperature=1.0) | setting
    out = generate(model, torch.tensor(prompts), 20, generator=torch.Generator().manual_seed(11),
                   **setting)
    assert out[:, 3:].tolist() == reference_draws(z, prompts, 20,
                                                  torch.Generator().manual_seed(11), **setting)
