"""A folder of ``attnlab prune --ffn`` (and ``--layers``) exports as any model of its width and
depth: transformers loads the Hugging Face folder ``save_pretrained`` writes and gives the pruned
model's logits (GPT-2, Llama with SwiGLU, Marian); ``export gguf`` (f32) read back by attnlab's
GGUF reader, and ``export onnx`` run by onnxruntime, give them too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model, from_pretrained, load, save_pretrained
from attnlab.compression.structured import drop_layers
from attnlab.storage import save_model_dir
from tests.cli.helpers import cli_captured

transformers = pytest.importorskip("transformers")

TEXT = "the quick brown fox jumps over the lazy dog, 12 times"


def _randomised(model):
    with torch.no_grad():  # norms, biases away from 1 and 0; weights large enough to matter
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # Marian's fixed table
                p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05))
    return model.eval()


HF = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=3, n_head=4, n_inner=64,
        bos_token_id=0, eos_token_id=0)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False)),
    "marian": lambda: transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=49,
        decoder_start_token_id=49, eos_token_id=0, forced_eos_token_id=None,
        activation_function="swish", scale_embedding=True)),
}
LAYERS = {"gpt2": {"blocks": [1]}, "llama": {"blocks": [0]},
          "marian": {"encoder": [0], "decoder": [2]}}


@pytest.mark.parametrize("family", list(HF))
def test_pruned_models_save_as_hugging_face_folders_transformers_runs(family, tmp_path):
    """From a Hugging Face folder: ``prune --ffn 0.25`` (the command reads it), then layers
    dropped; transformers' model of the saved folder computes attnlab's logits."""
    torch.manual_seed(0)
    _randomised(HF[family]()).save_pretrained(tmp_path / "hf")
    r = cli_captured("prune", "--model", tmp_path / "hf", "--ffn", "0.25", "--out",
                     tmp_path / "pruned")
    assert r.code == 0, r.err
    ours = load(tmp_path / "pruned").model
    assert ours.config.d_ff == 48
    drop_layers(ours, LAYERS[family])
    save_pretrained(ours, tmp_path / "out")
    cls = type(HF[family]())
    theirs = cls.from_pretrained(tmp_path / "out").eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 49, (2, 9), generator=g)
    with torch.no_grad():
        if family == "marian":
            tgt = torch.randint(1, 49, (2, 6), generator=g)
            tgt[:, 0] = 49
            expected, got = theirs(input_ids=ids, decoder_input_ids=tgt).logits, ours(ids, tgt)
            assert theirs.config.encoder_ffn_dim == theirs.config.decoder_ffn_dim == 48
            assert (theirs.config.encoder_layers, theirs.config.decoder_layers) == (1, 2)
        else:
            expected, got = theirs(ids).logits, ours(ids)
            assert theirs.config.num_hidden_layers == 2
    assert (got - expected).abs().max() <= 1e-4
    assert from_pretrained(tmp_path / "out").config.d_ff == 48  # and attnlab reads it back


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny Llama (SwiGLU, grouped-query attention) with a byte-level BPE tokenizer, pruned
    by the command: --ffn 0.25 then --layers 1."""
    from attnlab.tokenizers.bpe import BPETokenizer

    root = tmp_path_factory.mktemp("pruned-llama")
    tok = BPETokenizer.train([TEXT, "hello world, attention is all you need"] * 40,
                             vocab_size=300, min_frequency=1)
    config = ModelConfig.from_preset(
        "llama-mini", vocab_size=tok.vocab_size, d_model=64, n_heads=4, num_kv_heads=2,
        d_ff=128, n_decoder_layers=3, max_len=64, bos_id=2, eos_id=3, pad_id=0, unk_id=1,
        tie_embeddings=False)
    torch.manual_seed(0)
    folder = save_model_dir(root / "m", _randomised(build_model(config)), config,
                            {"text": tok.to_dict()})
    (root / "t.txt").write_text(TEXT * 8)
    r = cli_captured("prune", "--model", folder, "--ffn", "0.25", "--out", root / "ffn")
    assert r.code == 0, r.err
    r = cli_captured("prune", "--model", root / "ffn", "--layers", "1", "--data", root / "t.txt",
                     "--block", "16", "--out", root / "p")
    assert r.code == 0, r.err
    loaded = load(root / "p")
    assert (loaded.config.d_ff, loaded.config.n_decoder_layers) == (96, 2)
    return root / "p", loaded


def test_a_pruned_folder_exports_to_gguf(llama_folder, tmp_path):
    pytest.importorskip("gguf")
    from attnlab.interop.gguf import load_gguf

    folder, loaded = llama_folder
    r = cli_captured("export", "gguf", "--model", folder, "--out", tmp_path / "m.gguf", "--type",
                     "f32")
    assert r.code == 0, r.err
    model, tok = load_gguf(tmp_path / "m.gguf")
    assert (model.config.d_ff, model.config.n_decoder_layers) == (96, 2)
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        assert torch.equal(model(ids), loaded.model(ids))


def test_a_pruned_folder_exports_to_onnx(llama_folder, tmp_path):
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)
    from attnlab.interop.onnx_run import load_onnx

    folder, loaded = llama_folder
    r = cli_captured("export", "onnx", "--model", folder, "--out", tmp_path / "onnx")
    assert r.code == 0, r.err
    runner = load_onnx(tmp_path / "onnx")
    ids = torch.randint(4, loaded.config.vocab_size, (2, 7),
                        generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    logits, _ = runner.step(ids.numpy(), mask.numpy(), runner.graphs["decoder"].empty_past(2))
    with torch.no_grad():
        expected = loaded.model(ids, attention_mask=mask).numpy()
    assert np.abs(logits - expected).max() <= 1e-4
