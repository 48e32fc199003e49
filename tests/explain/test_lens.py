"""The logit lens and the residual stream: each layer's lens equals the logits of the same model
cut after that layer, and the last layer's equals the model's own."""

import copy

import pytest
import torch
from torch import nn

from attnlab import ModelConfig
from attnlab.errors import BadInput
from attnlab.explain.hooks import trace
from attnlab.explain.lens import format_lens, head_contributions, logit_lens, residual_stream
from attnlab.explain.output import usable
from attnlab.explain.probe import Probe, image_probe, sentence_probe
from attnlab.models import BERT, GPT, Transformer, ViT
from attnlab.tokenizers import WordTokenizer
from tests.explain.test_hooks import SMALL

WORDS = "paris is the capital of france and rome is the capital of italy".split()


def word_tok() -> WordTokenizer:
    return WordTokenizer.train([" ".join(WORDS)])


def gpt(preset: str) -> GPT:
    torch.manual_seed(0)
    extra = {"num_kv_heads": 2} if preset == "llama-mini" else {}
    return GPT(ModelConfig.from_preset(preset, n_decoder_layers=3, **SMALL, **extra)).eval()


def cut(model: nn.Module, stack: str, keep: int) -> nn.Module:
    """A copy of ``model`` whose ``stack`` keeps its first ``keep`` layers: the reference for
    the lens at layer ``keep - 1`` (the final norm and head unchanged)."""
    short = copy.deepcopy(model)
    layers = getattr(short, stack).layers
    getattr(short, stack).layers = nn.ModuleList(list(layers)[:keep])
    return short


def assert_lens_is_the_cut_model(probe: Probe) -> None:
    """Layer l's lens (top tokens, p(final prediction)) = the model cut after layer l."""
    n = len(getattr(probe.model, probe.stack).layers)
    lens = logit_lens(probe, k=3)
    assert lens.check.ok, lens.check
    # the scores a token may be chosen from: an encoder–decoder's <pad> is never read
    final = usable(probe.forward().float(), probe.model).argmax(-1)
    assert torch.equal(lens.final_ids, final)
    for layer in range(n):
        own = usable(probe.forward(cut(probe.model, probe.stack, layer + 1)).float(),
                     probe.model).softmax(-1)
        top = own.topk(3, dim=-1)
        torch.testing.assert_close(lens.top_probs[layer + 1], top.values, rtol=0, atol=1e-5)
        torch.testing.assert_close(lens.final_probs[layer + 1], own[torch.arange(len(final)),
                                                                    final], rtol=0, atol=1e-5)
    assert torch.equal(lens.top_ids[-1, :, 0], final)


@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])
def test_decoder_only_lens(preset):
    model, tok = gpt(preset), word_tok()
    probe = sentence_probe(model, tok, "the capital of france is")
    assert probe.stack == "blocks" and probe.read == list(range(5))
    assert_lens_is_the_cut_model(probe)
    with torch.no_grad():  # the last layer's lens, against the model's own logits
        own = model(probe_ids(tok, "the capital of france is"))[0]
    lens = logit_lens(probe)
    torch.testing.assert_close(lens.final_probs[-1],
                               own.softmax(-1).gather(-1, own.argmax(-1, keepdim=True))[:, 0],
                               rtol=0, atol=1e-6)


def probe_ids(tok, sentence):
    return torch.tensor([tok.encode(sentence)])


def test_bert_lens_reads_the_mask_positions(tmp_path):
    from tests.cli.helpers import tiny_bert

    corpus = tmp_path / "c.txt"
    corpus.write_text("paris is the capital of france\n" * 20)
    folder = tiny_bert(corpus, tmp_path / "bert", 40, 32)
    from attnlab.storage import load

    loaded = load(folder)
    with pytest.raises(BadInput, match="masked-LM"):  # bert-tiny's head is none
        sentence_probe(loaded.model, loaded.tokenizers["text"], "paris is the [MASK]")
    torch.manual_seed(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", head="mlm",
                                         vocab_size=loaded.model.config.vocab_size)).eval()
    tok = loaded.tokenizers["text"]
    with pytest.raises(BadInput, match=r"\[MASK\]"):
        sentence_probe(model, tok, "paris is the capital")
    probe = sentence_probe(model, tok, "[MASK] is the capital of [MASK]")
    assert [probe.tokens[p] for p in probe.read] == ["[MASK]", "[MASK]"]
    assert_lens_is_the_cut_model(probe)


def test_encoder_decoder_lens_reads_the_decoder():
    from attnlab.explain.seq2seq import decoder_input

    torch.manual_seed(0)
    tok = word_tok()
    model = Transformer(ModelConfig.from_preset("tiny", **SMALL)).eval()
    probe = sentence_probe(model, tok, "paris is the capital", target="rome is")
    assert probe.stack == "decoder"
    tgt = decoder_input(model, tok, "rome is")
    assert len(probe.tokens) == tgt.shape[1] == 3
    assert_lens_is_the_cut_model(probe)


def test_vit_lens_reads_cls():
    torch.manual_seed(0)
    model = ViT(ModelConfig.from_preset("vit-tiny", n_encoder_layers=2)).eval()
    c = model.config
    image = torch.randn(1, c.num_channels, c.image_size, c.image_size)
    probe = image_probe(model, image)
    assert probe.read == [0]
    assert_lens_is_the_cut_model(probe)


def test_the_check_fails_when_the_lens_is_not_the_models_readout():
    model, tok = gpt("gpt-mini"), word_tok()
    probe = sentence_probe(model, tok, "the capital of france")
    probe.call = lambda m: m(probe_ids(tok, "the capital of france"))[0] * 1.01  # not its own
    lens = logit_lens(probe)
    assert not lens.check.ok
    assert "FAILED" in format_lens(lens)


def test_residual_stream_heads_add_up_to_the_attention_output():
    """Each head's contribution through W_O, summed with W_O's bias, is the attention's output;
    the head named is the one whose contribution projects most onto the update."""
    model, tok = gpt("gpt-mini"), word_tok()
    probe = sentence_probe(model, tok, "the capital of france is")
    rows = residual_stream(probe)
    run = trace(model, forward=probe.forward)
    p = probe.last
    for i, row in enumerate(rows):
        attention = model.blocks.layers[i].self_attn
        c = head_contributions(attention, run[f"blocks.{i}.self_attn.heads"][0, p])
        torch.testing.assert_close(c.sum(0) + attention.out_proj.bias,
                                   run[f"blocks.{i}.self_attn.out"][0, p], rtol=0, atol=1e-6)
        u = run[f"blocks.{i}.out"][0, p] - run[f"blocks.{i}.in"][0, p]
        assert row.update == pytest.approx(float(u.norm()), rel=1e-6)
        push = c @ u / u.norm()
        assert row.head == f"self {int(push.argmax())}"
        assert row.push == pytest.approx(float(push.max()), rel=1e-5)
    lens = logit_lens(probe)
    assert [r.token for r in rows] == lens.top_ids[1:, -1, 0].tolist()
