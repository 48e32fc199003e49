"""The output stage: the probabilities against an independent softmax of the filtered logits,
the choice against generation's own (greedy and seeded samples), on a decoder-only model, the
encoder–decoder and a masked LM at [MASK]."""

import pytest
import torch

from attnlab import BERT, GPT, ModelConfig
from attnlab.errors import BadInput
from attnlab.explain import make_subject, walk
from attnlab.explain.output import Choice, predict
from attnlab.generation.decode import filter_logits, generate, next_tokens
from attnlab.tokenizers import CharTokenizer, WordPieceTokenizer

TEXT = "to be or not to be"


@pytest.fixture(scope="module")
def gpt():
    tok = CharTokenizer.train([TEXT])
    torch.manual_seed(0)
    model = GPT(ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                        n_heads=4, d_ff=64, n_decoder_layers=2, dropout=0.0))
    return model.eval(), tok


def _walk(model, tok, sentence, choice):
    w = walk(make_subject(model, tok, sentence, "test"), 1, 0)
    chosen = predict(w, choice)
    return w, chosen


def _own_logits(model, tok, sentence):
    with torch.no_grad():
        return model(torch.tensor([tok.encode(sentence)]))[0, -1]


@pytest.mark.parametrize("choice", [Choice(), Choice(0.7, top_k=5), Choice(1.3, top_p=0.6),
                                    Choice(0.9, top_k=8, top_p=0.8, seed=3)])
def test_probabilities_equal_softmax_of_filtered_logits(gpt, choice):
    model, tok = gpt
    w, chosen = _walk(model, tok, TEXT, choice)
    assert all(c.ok for c in w.checks), [c for c in w.checks if not c.ok]
    logits = _own_logits(model, tok, TEXT)
    t = choice.temperature or 1.0
    want = torch.softmax(filter_logits(logits / t, choice.top_k, choice.top_p), -1)
    table = w.stage("output: probabilities")
    top = want.topk(table.value.shape[0])
    assert torch.allclose(table.value[:, 0], top.values, atol=1e-6)
    assert table.rows == [tok.decode([int(i)], skip_special=False) for i in top.indices]
    assert want[chosen] > 0
    if choice.greedy:
        assert chosen == int(logits.argmax())


def test_greedy_choice_is_generates_first_token(gpt):
    model, tok = gpt
    w, chosen = _walk(model, tok, "not to", Choice())
    ids = torch.tensor([tok.encode("not to")])
    assert chosen == int(generate(model, ids, 1)[0, -1])
    assert w.checks[-1].ok and "generate's first token" in w.checks[-1].name


def test_a_seeded_sample_is_reproducible_and_next_tokens(gpt):
    model, tok = gpt
    choice = Choice(1.5, top_k=10, seed=7)
    picks = {_walk(model, tok, TEXT, choice)[1] for _ in range(2)}
    assert len(picks) == 1
    logits = _own_logits(model, tok, TEXT)
    g = torch.Generator().manual_seed(7)
    assert picks == {int(next_tokens(logits[None], 1.5, 10, None, g)[0])}
    # across seeds the draws differ somewhere (a flat distribution at T = 1.5)
    many = {_walk(model, tok, TEXT, Choice(1.5, seed=s))[1] for s in range(12)}
    assert len(many) > 1


def test_masked_lm_predicts_at_the_mask(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat on the rug\n" * 20)
    tok = WordPieceTokenizer.train([corpus], vocab_size=60)
    torch.manual_seed(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size, max_len=32,
                                         head="mlm")).eval()
    sentence = "the cat [MASK] on the mat"
    w, chosen = _walk(model, tok, sentence, Choice())
    assert all(c.ok for c in w.checks)
    ids = torch.tensor([tok.encode_single(sentence)])
    at = int((ids[0] == tok.mask_id).nonzero()[0])
    with torch.no_grad():
        logits = model(ids)[0, at]
    assert chosen == int(logits.argmax())
    assert w.stage("output: hidden state").rows == ["[MASK]"]
    top = w.stage("output: probabilities").value[:, 0]
    assert torch.allclose(top, logits.softmax(-1).topk(len(top)).values, atol=1e-6)
    # no [MASK]: nothing is predicted, no output stage
    w2, none = _walk(model, tok, "the cat sat on the mat", Choice())
    assert none is None and not any(s.title.startswith("output") for s in w2.stages)


@pytest.mark.parametrize("kwargs, flag", [(dict(temperature=-1), "temperature"),
                                          (dict(temperature=1, top_p=1.5), "top_p"),
                                          (dict(temperature=1, top_p=0), "top_p"),
                                          (dict(temperature=1, top_k=0), "top_k"),
                                          (dict(top_k=3), "top_k")])
def test_bad_choices_are_refused(kwargs, flag):
    with pytest.raises(BadInput, match=flag):
        Choice(**kwargs)
