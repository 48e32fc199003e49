"""The one sampling step and the one decoding pipeline that generate, chat and serve share,
and the old import paths of decoding, which still work with a DeprecationWarning."""

import io
import warnings

import numpy as np
import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.errors import BadInput
from attnlab.generation.decode import generate, next_tokens
from attnlab.generation.pipeline import Decoding, DecodingOptions, decoding_runtime
from attnlab.storage import load, save_model_dir
from attnlab.tokenizers.base import CharTokenizer

TEXT = "to be or not to be, that is the question"


def test_next_tokens_is_argmax_when_greedy_and_a_seeded_draw_of_the_filtered_softmax():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(next_tokens(logits), logits.argmax(-1))
    # the reference: numpy's softmax of the top-2 logits at T = 0.7, drawn with the same seed
    t, k = 0.7, 2
    drawn = next_tokens(logits, t, top_k=k, generator=torch.Generator().manual_seed(5))
    z = logits.double().numpy() / t
    kth = np.sort(z, -1)[:, -k][:, None]
    p = np.where(z >= kth, np.exp(z - z.max(-1, keepdims=True)), 0.0)
    p /= p.sum(-1, keepdims=True)
    want = torch.multinomial(torch.from_numpy(p).float(), 1,
                             generator=torch.Generator().manual_seed(5)).squeeze(-1)
    assert torch.equal(drawn, want)
    assert all(p[r, int(drawn[r])] > 0 for r in range(3))  # never outside the top-k


def test_the_repetition_penalty_applies_to_the_tokens_seen():
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    assert int(next_tokens(logits)) == 0
    assert int(next_tokens(logits, seen=torch.tensor([[0]]), repetition_penalty=1.2)) == 1


def test_serve_samples_with_the_same_step():
    import attnlab.serving.engine as engine

    assert engine.next_tokens is next_tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    tok = CharTokenizer.train([TEXT])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, n_decoder_layers=2, d_ff=64, max_len=64)
    path = tmp_path_factory.mktemp("lm") / "model"
    save_model_dir(path, GPT(config).eval(), config, {"text": tok.to_dict()})
    return path


def test_the_pipeline_decodes_what_generate_decodes_and_streams_its_text(folder):
    options = DecodingOptions(device="cpu", precision="fp32", max_new_tokens=12)
    decoding = Decoding(load(folder), options)
    tok = decoding.tokenizer
    ids = tok.encode("to be")
    out = io.StringIO()
    reply = decoding.decode(ids, out=out)
    plain = load(folder).model  # not prepared: generate alone
    want = generate(plain, torch.tensor([ids]), 12)[0, len(ids):].tolist()
    assert reply.text == out.getvalue() == tok.decode(want)
    assert len(reply.ticks) == 12 and reply.prompt_tokens == len(ids)
    assert reply.timing(0.5).startswith("timing: load 0.50 s | compile 0.00 s | prompt 5 tokens")


def test_the_pipeline_stops_at_a_stop_string_and_never_writes_it(folder):
    decoding = Decoding(load(folder), DecodingOptions(device="cpu", precision="fp32",
                                                      max_new_tokens=30))
    ids = decoding.tokenizer.encode("to be")
    full = decoding.decode(ids, out=io.StringIO()).text
    stop = full[3:5]
    out = io.StringIO()
    reply = decoding.decode(ids, [stop], out=out)
    assert reply.text == out.getvalue() == full[: full.index(stop)]


def test_the_pipeline_checks_its_settings_in_one_line(folder):
    decoding = Decoding(load(folder), DecodingOptions(device="cpu", precision="fp32",
                                                      top_p=1.5))
    with pytest.raises(BadInput, match=r"top_p must be in \(0, 1\], got 1.5"):
        decoding.check([1, 2])
    with pytest.raises(BadInput, match="integer weights set their own precision"):
        decoding_runtime(DecodingOptions(device="cpu", precision="fp32", bits=4))


def test_the_old_decoding_paths_still_work_with_a_deprecation_warning():
    import attnlab.generation.decoder_only as decoder_only
    import attnlab.generation.translation as translation
    from attnlab.cpu import for_decoding
    from attnlab.generation.seq2seq import translate

    with pytest.warns(DeprecationWarning, match="generation.decode.generate"):
        assert decoder_only.generate is generate
    with pytest.warns(DeprecationWarning, match="attnlab.cpu.prepare.for_decoding"):
        assert decoder_only.for_decoding is for_decoding
    with pytest.warns(DeprecationWarning, match="generation.seq2seq.translate"):
        assert translation.translate is translate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            decoder_only.no_such_name  # noqa: B018


def test_ctrl_c_during_generate_stops_as_any_ctrl_c(folder, monkeypatch, capsys):
    """The pipeline hands the reply so far to chat (Interrupted); generate does not catch it,
    and the command line stops as on any Ctrl-C: one line, exit code 130, no traceback."""
    import attnlab.generation.pipeline as pipeline
    from attnlab.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "generate", interrupted)
    code = main(["generate", "--model", str(folder), "--prompt", "to be", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip().endswith("attnlab: interrupted")
    assert "Traceback" not in err and "internal error" not in err


def test_a_model_off_the_cpu_is_left_as_it_is_and_builds_no_kernels(monkeypatch):
    """The decoding loops ready a CPU model's attention and integer layers for attnlab's
    kernels; a model elsewhere (here the meta device, as a GPU's would be) keeps its classes
    and never asks for the kernels to be built."""
    import attnlab.cpu.kernels as kernels
    from attnlab.cpu import DecodeAttention, KernelInt4Linear, decoding_kernels_
    from attnlab.nn.multihead import MultiHeadAttention
    from attnlab.nn.quantized import Int4Linear, quantize

    asked = []
    monkeypatch.setattr(kernels, "available", lambda: asked.append(1) or True)
    config = ModelConfig.from_preset("llama-mini", n_decoder_layers=1)
    with torch.device("meta"):
        elsewhere = GPT(config)
    quantize(elsewhere, bits=4, skeleton=True)
    decoding_kernels_(elsewhere)
    assert asked == []
    assert {type(m) for m in elsewhere.modules()} & {DecodeAttention, KernelInt4Linear} == set()
    assert any(type(m) is MultiHeadAttention for m in elsewhere.modules())
    here = GPT(config)
    quantize(here, bits=4)
    decoding_kernels_(here)
    assert asked and not any(type(m) in (MultiHeadAttention, Int4Linear) for m in here.modules())
