"""GGUF export (attnlab.interop.gguf_write, `attnlab export gguf`): a Llama-architecture model
and its BPE tokenizer written in each type and read back by attnlab's own GGUF reader, against
the model itself (f32), the model with its matrices rounded to f16 (f16), and the formats'
per-block error bounds (q8_0, q4_1)."""

from __future__ import annotations

import pytest
import torch

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.interop.gguf import load_gguf
from attnlab.interop.gguf_write import save_gguf
from attnlab.storage import save_model_dir
from attnlab.tokenizers.bpe import BPETokenizer
from tests.cli.helpers import cli

pytest.importorskip("gguf")

TEXT = "the quick brown fox jumps over the lazy dog, 12 times"


@pytest.fixture(scope="module")
def llama():
    """A tiny Llama (grouped key/value heads, linear RoPE scaling, an untied head) with
    perturbed norm gains, and a byte-level BPE tokenizer of 300 tokens."""
    texts = [TEXT, "hello world, attention is all you need", "1234 5678"] * 40
    tok = BPETokenizer.train(texts, vocab_size=300, min_frequency=1)
    config = ModelConfig.from_preset(
        "llama-mini", vocab_size=tok.vocab_size, d_model=64, n_heads=4, num_kv_heads=2,
        d_ff=128, n_decoder_layers=2, max_len=128, bos_id=2, eos_id=3, pad_id=0, unk_id=1,
        tie_embeddings=False, rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model, tok


def _ids(tok) -> torch.Tensor:
    return torch.tensor([tok.encode(TEXT)])


def test_f32_round_trips_exactly_with_its_config_and_tokenizer(llama, tmp_path):
    model, tok = llama
    loaded, loaded_tok = load_gguf(save_gguf(model, tok, tmp_path / "m.gguf", "f32"))
    for field in ("vocab_size", "d_model", "n_heads", "num_kv_heads", "d_ff",
                  "n_decoder_layers", "max_len", "rope_base", "rope_scaling", "norm_eps",
                  "tie_embeddings", "bos_id", "eos_id", "pad_id", "unk_id"):
        assert getattr(loaded.config, field) == getattr(model.config, field), field
    theirs = loaded.state_dict()
    assert all(torch.equal(theirs[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(loaded(_ids(tok)), model(_ids(tok)))
    for text in (TEXT, "unseen words: zebra 909!"):
        assert loaded_tok.encode(text) == tok.encode(text)
        assert loaded_tok.decode(tok.encode(text)) == text


def test_f16_holds_the_matrices_rounded_to_f16(llama, tmp_path):
    model, tok = llama
    loaded, _ = load_gguf(save_gguf(model, tok, tmp_path / "m.gguf", "f16"))
    rounded = build_model(model.config).eval()
    rounded.load_state_dict({k: v.half().float() if v.dim() == 2 else v
                             for k, v in model.state_dict().items()})
    with torch.no_grad():
        assert (loaded(_ids(tok)) - rounded(_ids(tok))).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_block_quantised_matrices_stay_within_half_a_step(llama, kind, tmp_path):
    """Per block of 32 inputs: q8_0's step is max|w|/127 (an f16 scale), q4_1's
    (max − min)/15 with an f16 minimum; each weight is within half a step, plus the f16
    rounding of the block's scale and minimum."""
    model, tok = llama
    path = save_gguf(model, tok, tmp_path / "m.gguf", kind)
    loaded, _ = load_gguf(path)
    theirs = loaded.state_dict()
    for name, w in model.state_dict().items():
        if w.dim() == 1:
            assert torch.equal(theirs[name], w), name  # norms stay f32
            continue
        blocks = w.reshape(w.shape[0], -1, 32)
        if kind == "q8_0":
            step = blocks.abs().amax(-1) / 127
            slack = step * 2**-10 * 127
        else:
            step = (blocks.amax(-1) - blocks.amin(-1)) / 15
            slack = (blocks.amin(-1).abs() + 15 * step) * 2**-10
        bound = (step / 2 + slack)[..., None]
        error = (theirs[name].reshape(blocks.shape) - blocks).abs()
        assert bool((error <= bound + 1e-7).all()), name
    full = save_gguf(model, tok, tmp_path / "f32.gguf", "f32")
    assert path.stat().st_size < full.stat().st_size / (3 if kind == "q8_0" else 5)


def test_q4_1_file_runs_on_its_own_4_bit_codes(llama, tmp_path):
    """--int4 keeps a Q4_1 file's codes (Int4Linear): its layers hold what the file holds."""
    from attnlab.nn.quantized import Int4Linear

    model, tok = llama
    path = save_gguf(model, tok, tmp_path / "m.gguf", "q4_1")
    codes, _ = load_gguf(path, quantized=True)
    dequantised, _ = load_gguf(path)
    layers = [m for m in codes.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 7 * model.config.n_decoder_layers
    with torch.no_grad():
        a, b = codes(_ids(tok)).float(), dequantised(_ids(tok))
    assert bool((a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9)


def test_q8_0_file_runs_on_8_bit_codes_per_channel(llama, tmp_path):
    """--int8 on a Q8_0 file: PyTorch's int8 kernel takes one scale per output channel, so the
    file's blocks (a scale per 32 weights) are re-quantised per channel from their values;
    each weight moves by at most half its row's step (max|row| / 254) from what the file
    holds, and the logits stay near the float model's."""
    from attnlab.nn.quantized import Int8Linear
    from attnlab.storage import load

    model, tok = llama
    path = save_gguf(model, tok, tmp_path / "m.gguf", "q8_0")
    codes = load(path, int8=True).model
    dequantised, _ = load_gguf(path)
    layers = {n: m for n, m in codes.named_modules() if isinstance(m, Int8Linear)}
    assert len(layers) == 7 * model.config.n_decoder_layers  # the output layer stays float
    file_values = dequantised.state_dict()
    for name, layer in layers.items():
        w = file_values[f"{name}.weight"]
        step = w.abs().amax(1, keepdim=True) / 127
        assert bool(((layer.weight - w).abs() <= step / 2 * (1 + 1e-6)).all()), name
    with torch.no_grad():
        a, b = codes(_ids(tok)).float(), dequantised(_ids(tok))
    assert (a - b).abs().max() <= 0.05 * b.abs().max()
    assert bool((a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9)


def test_export_command_then_generate_gives_the_same_text(llama, tmp_path, capsys):
    model, tok = llama
    folder = save_model_dir(tmp_path / "model", model, model.config, {"text": tok.to_dict()})
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    r = cli(capsys, "export", "gguf", "--model", folder, "--out", tmp_path / "m.gguf")
    assert r.code == 0, r.err
    assert "with its chat template" in r.out and (tmp_path / "m.gguf").exists()
    # the chat template travels; the special tokens are typed CONTROL for llama.cpp, the
    # rest NORMAL (llama.cpp then reads "<eos>" in a prompt as one token, as attnlab does)
    from gguf import GGUFReader, TokenType

    from attnlab.generation.chat import template_source

    assert template_source(tmp_path / "m.gguf") == template
    field = GGUFReader(tmp_path / "m.gguf").fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    control = {i for i, t in enumerate(types) if t == TokenType.CONTROL}
    assert control == {tok.encode(s)[0] for s in ("<pad>", "<unk>", "<bos>", "<eos>")}
    assert len(types) == model.config.vocab_size and types.count(TokenType.NORMAL) == \
        len(types) - 4
    texts = []
    for source in (folder, tmp_path / "m.gguf"):
        r = cli(capsys, "generate", "--model", source, "--prompt", "the quick",
                "--max-new-tokens", "12", "--ignore-eos", "--quiet")
        assert r.code == 0, r.err
        texts.append(r.out)
    assert texts[0] == texts[1] and len(texts[0]) > len("the quick")


def test_what_gguf_cannot_hold_is_one_line_and_exit_2(llama, tmp_path, capsys):
    model, tok = llama
    gpt2 = ModelConfig.from_preset("gpt-mini", n_decoder_layers=1, d_model=32, d_ff=64)
    folder = save_model_dir(tmp_path / "gpt2", build_model(gpt2), gpt2,
                            {"text": tok.to_dict()})
    cases = [
        (["--model", folder, "--out", tmp_path / "x.gguf"],
         "GGUF export writes Llama-architecture models"),
        (["--model", folder, "--out", tmp_path / "x.bin"], "a GGUF file's name ends in .gguf"),
    ]
    for args, message in cases:
        r = cli(capsys, "export", "gguf", *args)
        assert r.code == 2 and message in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".tmp-*"))
