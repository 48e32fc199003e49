"""ONNX export (attnlab.interop.onnx_export, `attnlab export onnx`) and its runner
(attnlab.interop.onnx_run): for each kind of model, onnxruntime's outputs equal attnlab's within
1e-4 on padded batches of other sizes than the graphs were traced with (batch 2, 3 new tokens
after 4 cached ones), and the cached greedy loops give attnlab's tokens."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.generation import generate, greedy_decode
from attnlab.interop.onnx_export import export_onnx
from attnlab.interop.onnx_run import as_past, load_onnx
from attnlab.storage import save_model_dir
from attnlab.tokenizers import CharTokenizer, tokenizer_from_dict
from tests.cli.helpers import assert_bad_input, cli, cli_captured

for _name in ("onnx", "onnxscript", "onnxruntime"):
    pytest.importorskip(_name, reason=f"ONNX export tests need {_name} (pip install "
                        "'attnlab[export]')")

TOL = 1e-4
TEXT = "the quick brown fox jumps over the lazy dog; attention is all you need"
SIZES = dict(d_model=32, n_heads=4, d_ff=64, max_len=24, dropout=0.0)


def _model(preset: str, **overrides) -> torch.nn.Module:
    config = ModelConfig.from_preset(preset, **{**SIZES, **overrides})
    torch.manual_seed(0)
    return build_model(config).eval()


def _left_padded(lengths: list[int], vocab: int, pad: int = 0) -> tuple[torch.Tensor, ...]:
    """Random ids ``(batch, max(lengths))``, each row's padding first, and the mask."""
    width = max(lengths)
    ids = torch.randint(4, vocab, (len(lengths), width))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
        ids[row, : width - n] = pad
    return ids, mask


def _max_diff(theirs: np.ndarray, ours: torch.Tensor) -> float:
    assert theirs.shape == tuple(ours.shape)
    return float(np.abs(theirs - ours.numpy()).max())


# --- decoder-only --------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request, tmp_path_factory):
    """GPT-2-style (learned positions, tied head; 2 layers), exported by the command from a
    model folder with a character tokenizer; and Llama-style (RoPE, grouped-query attention: 2
    key/value heads for 4 query heads, an untied head; 1 layer: exports cost seconds a layer),
    exported by the API."""
    tmp = tmp_path_factory.mktemp(request.param)
    tok = CharTokenizer.train([TEXT])
    if request.param == "gpt2":
        model = _model("gpt-mini", vocab_size=tok.vocab_size, n_decoder_layers=2)
        folder = save_model_dir(tmp / "model", model, model.config, {"text": tok.to_dict()})
        r = cli_captured("export", "onnx", "--model", folder, "--out", tmp / "onnx")
        assert r.code == 0, r.err
        assert "wrote" in r.out and "max |onnxruntime - attnlab|" in r.out, r.out
    else:
        model = _model("llama-mini", vocab_size=tok.vocab_size, n_decoder_layers=1,
                       num_kv_heads=2, tie_embeddings=False)
        export_onnx(model, tmp / "onnx", {"text": tok.to_dict()}, verify=False)
    return model, load_onnx(tmp / "onnx")


def test_decoder_graph_equals_the_model_with_a_past_and_left_padding(decoder):
    model, runner = decoder
    ids, mask = _left_padded([5, 7, 3], model.config.vocab_size)  # batch 3, 7 tokens
    graph = runner.graphs["decoder"]
    logits, past = runner.step(ids.numpy(), mask.numpy(), graph.empty_past(3))  # past 0
    with torch.no_grad():
        assert _max_diff(logits, model(ids, attention_mask=mask)) <= TOL
        last = model.config.n_decoder_layers - 1
        assert past[f"past_key_values.{last}.key"].shape == (3, model.config.kv_heads, 7,
                                                              model.config.d_k)
        # then 2 new tokens after the 7 cached ones: the same logits as the whole sequence
        more = torch.randint(4, model.config.vocab_size, (3, 2))
        full_mask = torch.cat([mask, torch.ones(3, 2, dtype=torch.long)], 1)
        logits, past = runner.step(more.numpy(), full_mask.numpy(), past)
        whole = model(torch.cat([ids, more], 1), attention_mask=full_mask)[:, -2:]
    assert _max_diff(logits, whole) <= TOL
    assert past["past_key_values.0.value"].shape[2] == 9


def test_decoder_greedy_loop_gives_generates_tokens_and_text(decoder):
    """Left-padded prompts past the model's context of 24 (each step then reruns the last 24
    tokens from position 0), and one prompt decoded back to text."""
    model, runner = decoder
    ids, mask = _left_padded([6, 9], model.config.vocab_size)
    ours = generate(model, ids, 20, attention_mask=mask)
    theirs = runner.generate(ids, 20, attention_mask=mask)
    assert np.array_equal(theirs, ours.numpy())
    tok = tokenizer_from_dict(json.loads((runner.folder / "tokenizers.json").read_text())["text"])
    prompt = torch.tensor([tok.encode("the quick")])
    assert (tok.decode(runner.generate(prompt, 8)[0].tolist())
            == tok.decode(generate(model, prompt, 8)[0].tolist()))


# --- encoder (BERT) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """BERT with segments and the masked-LM head."""
    model = _model("bert-tiny", vocab_size=50, n_encoder_layers=1, head="mlm")
    folder = tmp_path_factory.mktemp("bert") / "onnx"
    manifest = export_onnx(model, folder, verify=False)
    assert [o["name"] for o in manifest["graphs"]["encoder"]["outputs"]] == [
        "last_hidden_state", "logits"]
    return model, load_onnx(folder)


def test_encoder_graph_equals_the_model_on_a_padded_batch(bert):
    model, runner = bert
    ids, mask = _left_padded([4, 9, 6], 50)
    ids, mask = ids.flip(1), mask.flip(1)  # right padding, as BERT's batches come
    types = (torch.arange(9) >= 3).long().expand(3, 9) * mask
    out = runner(ids, mask, types)
    with torch.no_grad():
        assert _max_diff(out["last_hidden_state"], model.encode(ids, types, mask)) <= TOL
        assert _max_diff(out["logits"], model(ids, types, mask)) <= TOL


# --- encoder-decoder -----------------------------------------------------------------------
@pytest.fixture(scope="module", params=["transformer", "t5"])
def translator(request, tmp_path_factory):
    """The paper's model (sinusoidal positions, post-LN) and T5 (relative position bias,
    RMSNorm, unscaled attention), one layer a stack (exports cost seconds a layer)."""
    layers = dict(n_encoder_layers=1, n_decoder_layers=1, vocab_size=40)
    if request.param == "t5":
        model = _model("t5-small", **layers, head_dim=8, attention_dropout=0.0,
                       activation_dropout=0.0)
    else:
        model = _model("tiny", **layers)
    folder = tmp_path_factory.mktemp(request.param) / "onnx"
    export_onnx(model, folder, verify=False)
    return model, load_onnx(folder)


def _source(model) -> torch.Tensor:
    """Three sentences of 5, 3 and 6 tokens, each ending in eos, padded at the end (as
    translate pads them)."""
    c = model.config
    src = torch.full((3, 6), c.pad_id)
    for row, n in enumerate([5, 3, 6]):
        src[row, :n] = torch.randint(4, c.vocab_size, (n,))
        src[row, n - 1] = c.eos_id
    return src


def test_encoder_decoder_graphs_equal_the_model(translator):
    model, runner = translator
    src = _source(model)
    tgt = torch.randint(4, model.config.vocab_size, (3, 4))
    tgt[:, 0] = model.config.bos_id
    encoded = runner.graphs["encoder"].run({"input_ids": src.numpy()})
    decoder = runner.graphs["decoder"]
    fixed = {"encoder_attention_mask": (src != model.config.pad_id).long().numpy(),
             **as_past(encoded)}  # the cross-attention keys and values
    first = decoder.run({"input_ids": tgt[:, :3].numpy(), **fixed,
                         **decoder.empty_past(3, ".decoder.")})
    past = as_past(first)
    last = decoder.run({"input_ids": tgt[:, 3:].numpy(), **fixed, **past})
    with torch.no_grad():
        memory, _ = model.encode(src)
        logits = model(src, tgt)
    assert _max_diff(encoded["last_hidden_state"], memory) <= TOL
    assert _max_diff(first["logits"], logits[:, :3]) <= TOL
    assert _max_diff(last["logits"], logits[:, 3:]) <= TOL


def test_translator_greedy_loop_gives_greedy_decodes_tokens(translator):
    model, runner = translator
    src = _source(model)
    assert np.array_equal(runner.greedy_decode(src, max_len=12),
                          greedy_decode(model, src, max_len=12).numpy())
    one = src[1:2, :4]
    assert np.array_equal(runner.greedy_decode(one), greedy_decode(model, one).numpy())


# --- the command's errors ------------------------------------------------------------------
def test_what_cannot_be_exported_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    vit = _model("vit-tiny", max_len=17)
    vit_folder = save_model_dir(tmp_path / "vit", vit, vit.config, {})
    gpt = _model("gpt-mini", vocab_size=20, n_decoder_layers=1)
    folder = save_model_dir(tmp_path / "gpt", gpt, gpt.config, {})
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me\n")
    cases = [(vit_folder, tmp_path / "out", "arch='vision'"),
             (folder, tmp_path / "a-file", "--out"),
             (folder, tmp_path / "taken", "a folder with other files in it")]
    for model, out, message in cases:
        assert_bad_input(cli(capsys, "export", "onnx", "--model", model, "--out", out), message)
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if it were not installed
    r = cli(capsys, "export", "onnx", "--model", folder, "--out", tmp_path / "out")
    assert_bad_input(r, "needs the package onnxscript")
    assert (tmp_path / "taken" / "notes.txt").exists()
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))
