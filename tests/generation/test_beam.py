"""Beam search: k = 1 is greedy; beam 4 equals transformers' beam search; GNMT penalty."""

import pytest
import torch
import transformers

from attnlab.generation import beam_search, greedy_decode, length_penalty


def sources(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        body = torch.randint(2, 32, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g)
        rows.append(torch.cat([body, torch.ones(1, dtype=torch.long)]))
    width = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def test_beam_of_one_is_greedy(trained_marian):
    model, _ = trained_marian
    src = sources()
    assert torch.equal(beam_search(model, src, beam_size=1), greedy_decode(model, src))


def test_trained_model_reverses(trained_marian):
    model, _ = trained_marian
    src = sources()
    out = beam_search(model, src, beam_size=4)
    correct = 0
    for s, o in zip(src.tolist(), out.tolist(), strict=True):
        body = s[: s.index(1)]
        correct += o[1 : len(body) + 2] == body[::-1] + [1]
    assert correct >= 5  # the fixture is a working model, not a tie-breaking coin


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_beam_four_equals_transformers(trained_marian, alpha):
    model, folder = trained_marian
    theirs = transformers.MarianMTModel.from_pretrained(folder).eval()
    src = sources(8)
    mask = (src != 0).long()
    expected = theirs.generate(src, attention_mask=mask, num_beams=4, do_sample=False,
                               max_length=12, early_stopping=True, length_penalty=alpha,
                               forced_eos_token_id=None)
    got = beam_search(model, src, beam_size=4, alpha=alpha, max_len=12, penalty="average")
    assert [until_eos(r) for r in got.tolist()] == [until_eos(r) for r in expected.tolist()]


def until_eos(row):
    """A hypothesis up to and including eos (what follows is filler: pad, or eos in HF)."""
    return row[: row.index(1) + 1] if 1 in row else row


def test_scores_are_normalised_log_probabilities(trained_marian):
    """The returned score equals log P(Y | X) recomputed by a teacher-forced pass, divided by
    the GNMT penalty of its length (P over every token but pad, which is never emitted)."""
    model, _ = trained_marian
    src = sources(4)
    out, scores = beam_search(model, src, beam_size=4, alpha=0.6, return_scores=True)
    with torch.no_grad():
        logits = model(src, out[:, :-1])
        logits[..., model.config.pad_id] = float("-inf")
        logp = logits.log_softmax(-1)
    for row in range(len(src)):
        ys = out[row, 1:].tolist()
        n = ys.index(1) + 1 if 1 in ys else len(ys)
        total = sum(logp[row, t, ys[t]].item() for t in range(n))
        assert scores[row].item() == pytest.approx(total / length_penalty(n, 0.6), abs=1e-4)


def test_gnmt_penalty_values():
    assert length_penalty(1, 0.6) == 1.0  # ((5 + 1) / 6)^α
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(4, 1.0, "average") == 4.0
    with pytest.raises(ValueError, match="unknown length penalty"):
        length_penalty(3, 0.6, "bogus")
