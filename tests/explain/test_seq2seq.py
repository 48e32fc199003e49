"""The encoder–decoder walk: its decoder stages against the model's own pass, the translation
built one cached step at a time against translate, teacher forcing against the steps."""

import pytest
import torch

from attnlab import ModelConfig
from attnlab.explain import load_subject_model, make_subject
from attnlab.explain.seq2seq import decoder_input, walk_seq2seq
from attnlab.generation.seq2seq import greedy_decode
from attnlab.models import Transformer

SOURCE = "the cat sat on the mat"


def _t5_like(tok):
    """A tiny T5: pre-LN RMSNorm, a final norm, relative position bias, no biases, a tied
    head scaled by d^-½, no 1/√d_k."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("t5-small", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                                  head_dim=8, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                                  dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                  pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id,
                                  unk_id=tok.unk_id)
    return Transformer(cfg).eval()


@pytest.fixture(params=["tiny", "t5-like"])
def subject(request):
    model, tok, label, *_ = load_subject_model(None, [SOURCE])
    if request.param == "t5-like":
        model, label = _t5_like(tok), "t5-like"
    return make_subject(model, tok, SOURCE, label)


def test_decoder_input_is_bos_then_the_prefix(subject):
    tok = subject.tokenizer
    ids = decoder_input(subject.model, tok, "the cat")
    assert ids.tolist() == [[subject.model.config.bos_id, *tok.encode("the cat")]]
    assert decoder_input(subject.model, tok, None).tolist() == [[subject.model.config.bos_id]]


def test_decoder_stages_are_the_models_own(subject):
    """Every check passes, and the stages shown are the tensors of the model's own pass with
    need_weights, read here from the layers' attributes (not the walk's hooks)."""
    model, tok = subject.model, subject.tokenizer
    w, _ = walk_seq2seq(subject, tok, layer=1, head=2, target="the cat", steps=2)
    assert w.checks and all(c.ok for c in w.checks), [c for c in w.checks if not c.ok]
    tgt = decoder_input(model, tok, "the cat")
    with torch.no_grad():
        logits = model(subject.ids, tgt, need_weights=True)[0]
    block = model.decoder.layers[1]
    cross = w.stage("cross-attention: attention weights")
    assert torch.allclose(cross.value, block.cross_weights[0, 2], atol=1e-6)
    assert cross.rows == ["<bos>", "the", "cat"] and cross.cols == subject.tokens
    masked = w.stage("masked self-attention: attention weights")
    assert torch.allclose(masked.value, block.attn_weights[0, 2], atol=1e-6)
    assert torch.equal(w.stage("masked self-attention: mask").value,
                       torch.ones(3, 3, dtype=torch.int).tril())  # the triangle
    probs = w.stage("output: probabilities")
    want = logits[-1].softmax(-1)
    want[model.config.pad_id] = 0  # the walk leaves padding out, as translate does
    want = want / want.sum()
    top = want.topk(probs.value.shape[0])
    assert torch.allclose(probs.value[:, 0], top.values, atol=1e-6)


def test_translation_token_by_token_equals_translate(subject):
    model, tok = subject.model, subject.tokenizer
    model.config.max_len = 12  # an untrained model never ends: both stop at this length
    w, t = walk_seq2seq(subject, tok)
    assert all(c.ok for c in w.checks)
    own = greedy_decode(model, subject.ids)[0].tolist()
    assert t.tokens == own[: len(t.tokens)] and 1 < len(t.tokens) <= 12
    assert t.text == t.translate_text  # translate's own answer, which the walk asked for


def test_teacher_forcing_equals_the_steps(subject):
    """One causal pass over the target gives, at each position, the logits of decoding the
    same tokens one step at a time (recomputed here without the cache)."""
    model, tok = subject.model, subject.tokenizer
    w, _ = walk_seq2seq(subject, tok, target="the cat sat", steps=0)
    tf = next(c for c in w.checks if c.name.startswith("teacher forcing"))
    assert tf.ok
    tgt = decoder_input(model, tok, "the cat sat")
    with torch.no_grad():
        memory, mask = model.encode(subject.ids)
        steps = [model.decode(tgt[:, : t + 1], memory, mask)[0, -1] for t in range(4)]
        forced = model(subject.ids, tgt)[0]
    table = w.stage("teacher forcing").value
    nxt = tgt[0, 1:]
    want = torch.stack(steps).softmax(-1)[torch.arange(3), nxt]
    assert torch.allclose(table[:, 0], want, atol=1e-5)
    assert torch.allclose(forced, torch.stack(steps), atol=1e-5)


def test_a_broken_cache_fails_its_check(subject, monkeypatch):
    """Corrupt the cached steps' logits only: each step's check fails by that amount, the
    decoder's and the output stage's stay passed."""
    model = subject.model
    decode = model.decode

    def broken(tgt, memory, src_mask, cache=None, need_weights=False):
        out = decode(tgt, memory, src_mask, cache=cache, need_weights=need_weights)
        return out if cache is None else out + 0.25

    monkeypatch.setattr(model, "decode", broken)
    w, _ = walk_seq2seq(subject, subject.tokenizer, steps=3)
    failed = [c for c in w.checks if not c.ok]
    assert len(failed) == 3 and all("cached step" in c.name for c in failed)
    assert all(abs(c.error - 0.25) < 1e-5 for c in failed)


def test_layer_and_steps_are_checked(subject):
    from attnlab.errors import BadInput

    with pytest.raises(BadInput, match="--layer 5"):
        walk_seq2seq(subject, subject.tokenizer, layer=5)
    with pytest.raises(BadInput, match="--steps"):
        walk_seq2seq(subject, subject.tokenizer, steps=-1)
