"""Untrusted model files are checked before allocation (attnlab.build): a config that lies
about its size or shapes is refused quickly and in little memory, by every loader."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time

import pytest
import torch

from attnlab import ModelConfig, build_model, hardware, save_pretrained
from attnlab.build import check_affordable, count_parameters, materialize, skeleton
from attnlab.config import PRESETS
from attnlab.errors import BadInput
from attnlab.storage import save_model_dir
from attnlab.tokenizers import CharTokenizer

TINY_GPT = dict(d_model=32, n_heads=2, d_ff=64, n_decoder_layers=2, max_len=64)


@pytest.mark.parametrize("preset, overrides", [
    ("tiny", {}), ("base", {}), ("gpt2", {}), ("llama-mini", {"n_decoder_layers": 5}),
    ("bert-tiny", {"head": "pretraining"}), ("bert-base", {"head": "classify"}),
    ("tiny", {"n_encoder_layers": 3, "n_decoder_layers": 1, "tie_embeddings": False}),
])
def test_the_estimate_is_the_built_models_count(preset, overrides):
    """The 1-and-2-layer extrapolation equals counting every parameter of the whole model."""
    config = ModelConfig.from_preset(preset, **overrides)
    assert count_parameters(config) == sum(p.numel() for p in skeleton(config).parameters())


def test_a_model_larger_than_memory_is_refused(monkeypatch):
    monkeypatch.setattr(hardware, "available_memory", lambda device=None: 10 * 2**20)
    config = ModelConfig.from_preset("gpt-mini")  # 0.8M parameters: 3.2 MB in fp32
    check_affordable(config, "m", None)
    with pytest.raises(BadInput, match=r"m: the model needs about .* GB \(.* parameters at 4 "
                                       r"bytes\), more than the 0.0 GB of memory available"):
        check_affordable(ModelConfig.from_preset("gpt2"), "m", None)


def _attnlab_folder(path):
    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt-mini", vocab_size=40, **TINY_GPT)
    tok = CharTokenizer.train(["abcdefghij klmnopqrstuvwxyz"])
    save_model_dir(path, build_model(config), config, {"text": tok.to_dict()})
    return path, "config.json"


def _hf_folder(path):
    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt-mini", vocab_size=40, **TINY_GPT)
    save_pretrained(build_model(config), path)
    return path, "config.json"


def generate_measured(folder) -> tuple[subprocess.CompletedProcess, float, float]:
    """``attnlab generate`` in a child process: the result, seconds, and the child's peak RSS
    in GB (from a wrapper, so that no other process counts)."""
    wrapper = ("import resource, subprocess, sys, time\n"
               "t = time.perf_counter()\n"
               "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)\n"
               "t = time.perf_counter() - t\n"
               "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20\n"
               "print(r.returncode, t, peak)\n"
               "sys.stderr.write(r.stderr)\n")
    r = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "attnlab.cli",
                        "generate", "--model", str(folder), "--prompt", "abc", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    code, seconds, peak = r.stdout.split()
    return subprocess.CompletedProcess(r.args, int(code), "", r.stderr), float(seconds), float(
        peak)


@pytest.mark.parametrize("make, layers_field, width_field", [
    (_attnlab_folder, "n_decoder_layers", "d_ff"),
    (_hf_folder, "n_layer", "n_inner"),
], ids=["attnlab-folder", "hugging-face-folder"])
def test_lying_configs_are_refused_fast_and_small(tmp_path, make, layers_field, width_field):
    folder, name = make(tmp_path / "model")
    honest = json.loads((folder / name).read_text())
    for field, value, expect in [
        (layers_field, 10**7, "but the weights hold only"),
        (width_field, 128, "in the model"),
    ]:
        (folder / name).write_text(json.dumps({**honest, field: value}))
        r, seconds, peak_gb = generate_measured(folder)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and expect in lines[0], r.stderr
        assert seconds < 5 and peak_gb < 1, (field, seconds, peak_gb)


def test_gguf_counts_beyond_the_file_are_refused(tmp_path):
    pytest.importorskip("gguf")
    from attnlab.interop.gguf import load_gguf

    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 10**15, 10**15) + b"\0" * 64)
    start = time.perf_counter()
    with pytest.raises(BadInput, match="claims 1,000,000,000,000,000 tensors"):
        load_gguf(path)
    assert time.perf_counter() - start < 1


def test_a_long_context_small_model_still_loads(tmp_path):
    """Computed position tables may outnumber a small model's parameters up to a fixed
    allowance (a llama-mini with a 16,384-token context: 1M table numbers, 0.7M parameters)."""
    from attnlab.storage import load

    config = ModelConfig.from_preset("llama-mini", vocab_size=65, max_len=16384)
    save_model_dir(tmp_path / "m", build_model(config), config,
                   {"text": CharTokenizer.train(["abc"]).to_dict()})
    assert load(tmp_path / "m").config.max_len == 16384


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_materialized_skeleton_is_the_built_model_but_for_its_weights(preset):
    """``materialize(skeleton(c))``, what loading fills from a file: the same tensors, shapes,
    dtypes and ties as ``build_model(c)``, and the same computed buffers (position tables),
    which no file holds."""
    full = ModelConfig.from_preset(preset)
    small = {"d_model": 32, "n_heads": 4, "d_ff": 64,
             "n_encoder_layers": min(full.n_encoder_layers, 1),
             "n_decoder_layers": min(full.n_decoder_layers, 1)}
    if full.num_kv_heads:
        small["num_kv_heads"] = 2
    if "image_size" not in PRESETS[preset]:
        small.update(vocab_size=40, max_len=16)
    config = ModelConfig.from_preset(preset, **small)
    built, made = build_model(config), materialize(skeleton(config))

    def sharing(model):
        ids = {}
        return [ids.setdefault(id(p), len(ids)) for _, p in
                model.named_parameters(remove_duplicate=False)]

    assert sharing(made) == sharing(built)  # tied weights stay tied
    state = dict(built.named_buffers())
    for name, t in [*made.named_parameters(), *made.named_buffers()]:
        ref = dict(built.named_parameters()).get(name, state.get(name))
        assert t.device.type == "cpu" and t.shape == ref.shape and t.dtype == ref.dtype, name
    persistent = set(built.state_dict())
    for name, t in made.named_buffers():
        if name not in persistent:
            assert torch.equal(t, state[name]), name
