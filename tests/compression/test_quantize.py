"""Post-training quantisation on a trained tiny model: its logits stay near float32, quantised
folders round-trip through ``attnlab.load`` and ``attnlab quantize``, bad input is one line.

The model is the session's character LM (tests/conftest.py::char_lm), trained to a stated
criterion (a held-out next-character loss below ``CHAR_LM_LOSS`` nats, checked; a cap of steps
that fails the fixture if reached first), so that its weights have the structure quantisation
meets in practice, unlike a random init.
"""

import copy
import json
import re

import pytest
import torch

from attnlab import ModelConfig, build_model, load
from attnlab.compression.quantize import SPEC_FILE, quantize_model
from attnlab.nn.quantized import Int4Linear, Int8Linear, float_dtype
from attnlab.storage import save_model_dir
from attnlab.tokenizers import CharTokenizer
from tests.cli.helpers import assert_bad_input, cli
from tests.conftest import PANGRAMS as TEXT

# top-1 agreement with float32 on the held-out positions, the thresholds this test states
AGREEMENT = {8: 0.99, 4: 0.9}


@pytest.fixture(scope="module")
def trained(char_lm):
    """(folder, model, tokenizer, held-out ids) of the session's trained 2-layer character
    llama-mini (tests/conftest.py::char_lm)."""
    return char_lm.folder, char_lm.model, char_lm.tokenizer, char_lm.held_out


def logits(model, ids):
    with torch.no_grad():
        return model(ids).float()


@pytest.mark.parametrize("bits, group", [(8, 32), (4, 32), (4, 64)])
def test_int8_and_int4_logits_stay_near_float(trained, bits, group):
    _, model, _, ids = trained
    reference = logits(model, ids)
    q = copy.deepcopy(model)
    spec = quantize_model(q, bits, group)
    assert len(spec["modules"]) == 2 * 7  # q, k, v, o, gate, up, down per layer
    kind = Int8Linear if bits == 8 else Int4Linear
    assert sum(isinstance(m, kind) for m in q.modules()) == 14
    out = logits(q, ids)
    agree = (out.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= AGREEMENT[bits], agree
    rel = ((out - reference).norm() / reference.norm()).item()
    assert rel < {8: 0.01, 4: 0.1}[bits], rel


def test_int2_is_worse_than_int4_but_still_a_model(trained):
    """int2 is reported as it is; here only that it degrades more than int4 and stays finite."""
    _, model, _, ids = trained
    reference = logits(model, ids)
    errors = {}
    for bits in (4, 2):
        q = copy.deepcopy(model)
        quantize_model(q, bits, 32)
        out = logits(q, ids)
        assert torch.isfinite(out).all()
        errors[bits] = ((out - reference).norm() / reference.norm()).item()
    assert errors[2] > errors[4]


@pytest.mark.parametrize("bits, activations", [(8, "float"), (4, "float"), (2, "float")])
def test_quantised_folders_round_trip_through_load(trained, tmp_path, capsys, bits, activations):
    folder, model, _, ids = trained
    r = cli(capsys, "quantize", "--model", folder, "--bits", bits, "--out", tmp_path / "q")
    assert r.code == 0, r.err
    spec = json.loads((tmp_path / "q" / SPEC_FILE).read_text())
    assert spec["bits"] == bits and len(spec["modules"]) == 14
    assert "kept in float: lm_head" in r.out
    loaded = load(tmp_path / "q")
    q = copy.deepcopy(model)
    quantize_model(q, bits, 32)
    for m in q.modules():  # the float weights are stored in bf16 (the codes' own are kept)
        if not isinstance(m, (Int8Linear, Int4Linear)):
            for p in m.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16).to(float_dtype())
    assert torch.equal(logits(loaded.model, ids), logits(q, ids))  # the codes, exactly
    # smaller on disk: codes, scales, zeros; the embedding stays float
    size = (tmp_path / "q" / "model.safetensors").stat().st_size
    assert size < (folder / "model.safetensors").stat().st_size * {8: 0.5, 4: 0.4, 2: 0.35}[bits]


@pytest.mark.parametrize("native", ["0", "1"])
def test_the_float_parts_run_in_the_cpus_fast_precision_and_slowness_is_said(
        trained, tmp_path, capsys, monkeypatch, native):
    """Where bf16 is emulated the layers around the integer kernels run in float32 and every
    load says that many-token passes are slower than float32; where it is native, bf16 and no
    warning. Either way the folder on disk is the same."""
    import warnings

    folder, *_ = trained
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", native)
    assert cli(capsys, "quantize", "--model", folder, "--bits", "4", "--out",
               tmp_path / "q").code == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load(tmp_path / "q")
    said = [str(w.message) for w in caught if "no fast path" in str(w.message)]
    assert len(said) == (native == "0")
    assert all("slower than float32" in m and "ATTNLAB_NATIVE_BF16=0" in m for m in said)
    want = torch.bfloat16 if native == "1" else torch.float32
    assert float_dtype() == want and loaded.model.embed.weight.dtype == want
    from safetensors import safe_open

    with safe_open(tmp_path / "q" / "model.safetensors", "pt") as f:
        assert f.get_slice("embed.weight").get_dtype() == "BF16"


def test_a_quantised_folder_runs_in_the_commands(trained, tmp_path, capsys):
    folder, *_ = trained
    assert cli(capsys, "quantize", "--model", folder, "--bits", "4", "--out",
               tmp_path / "q").code == 0
    r = cli(capsys, "generate", "--model", tmp_path / "q", "--prompt", "the quick",
            "--max-new-tokens", "8", "--device", "cpu")
    assert r.code == 0, r.err
    (tmp_path / "t.txt").write_text(TEXT * 2)
    r = cli(capsys, "evaluate", "lm", "--model", tmp_path / "q", "--text", tmp_path / "t.txt",
            "--device", "cpu")
    assert r.code == 0, r.err
    assert float(r.out.strip().splitlines()[-1].split()[-1]) < 3  # it learned TEXT
    (tmp_path / "q.jsonl").write_text(json.dumps(
        {"context": "the quick brown", "choices": ["fox", "dog"], "answer": 0}) + "\n")
    r = cli(capsys, "evaluate", "choice", "--model", tmp_path / "q", "--data",
            tmp_path / "q.jsonl", "--device", "cpu")
    assert r.code == 0, r.err
    assert r.out.startswith("acc 1.0000")  # it learned TEXT


def test_dynamic_int8_activations_for_an_encoder(tmp_path, capsys):
    config = ModelConfig.from_preset("bert-mini", vocab_size=40, max_len=32)
    torch.manual_seed(0)
    model = build_model(config).eval()
    tok = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz "])
    folder = save_model_dir(tmp_path / "bert", model, config, {"text": tok.to_dict()})
    r = cli(capsys, "quantize", "--model", folder, "--bits", "8", "--activations", "dynamic",
            "--out", tmp_path / "q")
    assert r.code == 0, r.err
    assert "activations int8 per call" in r.out
    loaded = load(tmp_path / "q")
    layers = [m for m in loaded.model.modules() if isinstance(m, Int8Linear)]
    assert layers and all(m.activations == "dynamic" for m in layers)
    ids = torch.randint(4, 30, (2, 12))
    with torch.no_grad():
        ref, out = model(ids), loaded.model(ids)
    ref, out = (ref[0], out[0]) if isinstance(ref, tuple) else (ref, out)
    assert ((out - ref).norm() / ref.norm()).item() < 0.02


@pytest.mark.parametrize("extra, message", [
    (("--bits", "3"), "bits must be one of 8, 4, 2, got 3"),
    (("--bits", "4", "--group", "48"), "group_size must be a power of two"),
    (("--bits", "4", "--group", "128"), "--group 128 does not divide the width 64 of "
                                        "blocks.layers.0"),
    (("--bits", "4", "--activations", "dynamic"), "dynamic activations are int8's"),
    (("--bits", "8", "--activations", "dynamic"), "--activations dynamic is for encoders"),
])
def test_bad_quantize_arguments(trained, tmp_path, capsys, extra, message):
    folder, *_ = trained
    r = cli(capsys, "quantize", "--model", folder, *extra, "--out", tmp_path / "q")
    assert_bad_input(r, message)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("change, message", [
    (lambda s: {**s, "bits": 3}, "bits must be one of 8, 4, 2"),
    (lambda s: {**s, "modules": [*s["modules"], "blocks.layers.9.ffn.w1"]},
     "'blocks.layers.9.ffn.w1' is not a linear layer"),
    (lambda s: {**s, "format": "gptq"}, "not an attnlab quantization spec"),
    (lambda s: {**s, "group_size": 64}, "does not match|is missing|in the file"),
])
def test_a_damaged_spec_is_one_line(trained, tmp_path, capsys, change, message):
    folder, *_ = trained
    assert cli(capsys, "quantize", "--model", folder, "--bits", "4", "--out",
               tmp_path / "q").code == 0
    path = tmp_path / "q" / SPEC_FILE
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    r = cli(capsys, "evaluate", "lm", "--model", tmp_path / "q", "--text", path)
    assert re.search(message, assert_bad_input(r, str(tmp_path / "q")))


@pytest.mark.parametrize("positional", ["alibi", "rope", "learned"])
def test_a_quantised_folder_loads_where_bf16_is_native(tmp_path, monkeypatch, positional):
    """With bf16 around the kernels, the position tables a load recomputes are cast like the
    rest of the model (an ALiBi bias left in float32 broke the bf16 attention), and the loaded
    model runs a plain forward, outside autocast."""
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", "1")
    tok = CharTokenizer.train([TEXT])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=64,
                                     n_heads=4, d_ff=128, n_decoder_layers=1, max_len=64,
                                     positional=positional)
    torch.manual_seed(0)
    model = build_model(config).eval()
    ids = torch.tensor([tok.encode(TEXT[:40])])
    with torch.no_grad():
        q = copy.deepcopy(model)
        quantize_model(q, 4, 32)
        save_model_dir(tmp_path / "q", q, config, {"text": tok.to_dict()},
                       extra_files={SPEC_FILE: lambda p: p.write_text(json.dumps(
                           {"format": "attnlab-quantized", "bits": 4, "group_size": 32,
                            "activations": "float", "modules": quantized_names(q)}))})
        loaded = load(tmp_path / "q").model
        tables = list(loaded.blocks.positional.buffers()) if hasattr(
            loaded.blocks, "positional") else []
        tables += list(loaded.positional.buffers()) if hasattr(loaded, "positional") else []
        assert all(t.dtype == torch.bfloat16 for t in tables)
        out = loaded(ids)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert torch.equal(out, q(ids))


def quantized_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, (Int8Linear, Int4Linear))]


def test_a_quantised_folder_says_its_integers_and_computes_its_float_parts_as_asked(
        trained, tmp_path, capsys):
    """``evaluate lm`` and ``generate`` on an int8 folder: the announce line names the integer
    weights and the dtype the float parts compute in, and ``--precision fp32`` does run them in
    float32: its perplexity is the one of the model with float32 float parts, computed here."""
    import math

    from attnlab.generation.likelihood import rolling_nll
    from attnlab.nn.quantized import integer_parts

    folder, _, tokenizer, _ = trained
    assert cli(capsys, "quantize", "--model", folder, "--bits", "8",
               "--out", tmp_path / "q").code == 0
    text = tmp_path / "held.txt"
    text.write_text(TEXT * 2)
    threads = torch.get_num_threads()
    r = cli(capsys, "evaluate", "lm", "--model", tmp_path / "q", "--text", text, "--block", "32",
            "--precision", "fp32", "--device", "cpu")
    assert r.code == 0, r.err
    running = [line for line in r.err.splitlines() if " running " in line]  # (a CPU without
    # native bf16 warns first that integer kernels are slower there)
    assert running == [f"attnlab evaluate: running {tmp_path / 'q'} on cpu, int8 weights, "
                       f"float32 float matrices, {threads} threads"]
    shown = float(re.search(r"perplexity: ([\d.]+)", r.out).group(1))
    model = load(tmp_path / "q").model.float()
    assert integer_parts(model) == (8, torch.float32)
    with torch.no_grad():
        nll, n = rolling_nll(model, tokenizer.encode(TEXT * 2), 32, 16, 8)
    assert shown == pytest.approx(math.exp(nll / n), rel=1e-4)
    g = cli(capsys, "generate", "--model", tmp_path / "q", "--prompt", "the", "--max-new-tokens",
            "2", "--device", "cpu", "--precision", "fp32")
    assert g.code == 0, g.err
    assert "int8 weights, float32 float matrices" in next(
        line for line in g.err.splitlines() if " running " in line)
    assert integer_parts(torch.nn.Linear(2, 2)) is None
