"""``--adapter DIR`` on the commands that run a model: a peft-format adapter added onto
``--model``, the same text as the adapted model gives in Python, and one clear line for an
adapter made for another base model."""

import json

import pytest
import torch

from attnlab import load
from attnlab.generation import generate
from attnlab.interop.peft import adapt, adapter_spec, save_adapter
from tests.cli.helpers import assert_bad_input, cli


@pytest.fixture(scope="module")
def lm_adapter(lm_run, tmp_path_factory):
    """A LoRA adapter for the ``lm_run`` model on every projection, with random B (an
    untrained adapter would change nothing)."""
    model = load(lm_run).model
    adapt(model, adapter_spec(model, r=2, targets=["qkv", "out_proj", "w1", "w2"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    folder = tmp_path_factory.mktemp("adapter")
    save_adapter(model, folder, base=str(lm_run))
    return folder, model.eval()


def test_generate_with_an_adapter_is_the_adapted_model(capsys, lm_run, lm_adapter):
    folder, adapted = lm_adapter
    loaded = load(lm_run)
    prompt = "to be"
    ids = torch.tensor([loaded.tokenizer.encode(prompt)])
    expected = loaded.tokenizer.decode(generate(adapted, ids, max_new_tokens=12)[0].tolist())
    plain = loaded.tokenizer.decode(generate(loaded.model, ids, max_new_tokens=12)[0].tolist())
    assert expected != plain  # the adapter changes the text, so the check below can fail
    r = cli(capsys, "generate", "--model", lm_run, "--adapter", folder, "--prompt", prompt,
            "--max-new-tokens", "12", "--device", "cpu", "--quiet")
    assert r.code == 0, r.err
    assert r.out.rstrip("\n") == expected


def test_an_adapter_for_another_model_is_one_line(capsys, mlm_run, lm_adapter):
    folder, _ = lm_adapter
    r = cli(capsys, "embed", "--model", mlm_run.path, "--adapter", folder, "a sentence",
            "--device", "cpu")
    assert_bad_input(r, str(folder), "made for a different base model")


def test_a_folder_that_is_no_adapter_is_named(capsys, lm_run, tmp_path):
    r = cli(capsys, "generate", "--model", lm_run, "--adapter", tmp_path, "--prompt", "to",
            "--device", "cpu")
    assert_bad_input(r, str(tmp_path), "adapter_config.json")


def test_an_adapter_with_int4_stays_beside_the_same_4_bit_codes(lm_run, lm_adapter):
    """``--int4 --adapter``: the base quantised first, as a QLoRA run trains over it, and the
    LoRA path beside its codes (folding then quantising again would lose an update smaller
    than a quantisation step)."""
    from attnlab.nn.lora import LoRALinear
    from attnlab.nn.quantized import Int4Linear

    folder, _ = lm_adapter
    adapted = load(lm_run, int4=True, adapter=folder).model
    plain = load(lm_run, int4=True).model
    layers = {n: m for n, m in adapted.named_modules() if isinstance(m, LoRALinear)}
    assert layers and all(isinstance(m.base, Int4Linear) for m in layers.values())
    for name, layer in layers.items():
        assert torch.equal(layer.base.qweight, plain.get_submodule(name).qweight)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert (adapted(ids) - plain(ids)).abs().max() > 1e-2  # the update is there


def test_lora_over_a_4_bit_base_keeps_the_codes_and_generates(capsys, lm_run, tmp_path):
    from safetensors.torch import load_file

    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 30)
    run = tmp_path / "run"
    r = cli(capsys, "train", "lm", "--init", lm_run, "--int4", "--lora", "2", "--text", text,
            "--block", "16", "--batch", "4", "--steps", "3", "--lr", "1e-2", "--out", run,
            "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert "adapters: LoRA r=2" in r.out
    step = run / "checkpoints" / "step-00000003"
    spec = json.loads((step / "quantization.json").read_text())
    assert spec["bits"] == 4 and all(m.endswith(".base") or "lora" not in m
                                     for m in spec["modules"])
    trained = load_file(str(step / "model.safetensors"))
    # the codes are those of the base quantised, untouched by training
    from attnlab.compression.quantize import quantize_model

    base = load(lm_run).model
    quantize_model(base, bits=4)
    codes = {k: v for k, v in base.state_dict().items() if k.endswith("qweight")}
    assert codes
    for name, value in codes.items():
        wrapped = name.replace(".qweight", ".base.qweight")
        assert torch.equal(trained.get(wrapped, trained.get(name)), value)
    assert any(k.endswith("lora_B.weight") and trained[k].abs().max() > 0 for k in trained)
    # loaded for inference, the LoRA path stays beside the 4-bit base (no float weight to
    # fold it into), with the trained B in the dtype an integer model's float parts take
    # (float_dtype(): bf16 where the CPU runs it natively, so the trained B rounded once)
    from attnlab.nn.lora import LoRALinear
    from attnlab.nn.quantized import float_dtype

    loaded = load(run).model
    layers = {n: m for n, m in loaded.named_modules() if isinstance(m, LoRALinear)}
    assert layers and loaded.config.adapter
    assert all(m.lora_B.weight.dtype == float_dtype() and torch.equal(
        m.lora_B.weight, trained[f"{n}.lora_B.weight"].to(float_dtype()))
        for n, m in layers.items())
    r = cli(capsys, "generate", "--model", run, "--prompt", "to be", "--max-new-tokens", "5",
            "--device", "cpu", "--quiet")
    assert r.code == 0, r.err
    assert r.out.startswith("to be")
