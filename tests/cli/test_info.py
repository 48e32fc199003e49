"""``attnlab info``: the parameter table against counts made here, and bad overrides.

Covered elsewhere, not repeated here:

- happy path: tests/test_cli.py::test_info_prints_architecture_and_parameter_table (base:
  63,082,496, the fields of the table), ::test_info_for_decoder_only_presets (gpt2),
  tests/test_hardware.py::test_info_hardware_ends_with_the_auto_choice (``--hardware``);
- bad input: tests/test_cli.py::test_bad_input_is_one_line_exit_2 (an unknown preset,
  ``--set d_model=30``, ``--set nonsense``).
"""

import pytest
import torch

from attnlab import ModelConfig, build_model
from tests.cli.helpers import assert_bad_input, cli


def paper_count(c: ModelConfig) -> dict[str, int]:
    """The paper's encoder-decoder (post-LN, biases, ReLU, sinusoidal positions, one tied
    embedding matrix) counted from its shape alone: 4 projections d×d + d per attention,
    two linear maps of the feed-forward, 2d per LayerNorm."""
    assert (c.arch, c.positional, c.norm, c.norm_placement, c.activation) == (
        "encoder-decoder", "sinusoidal", "layernorm", "post", "relu")
    assert c.bias and c.tie_embeddings and c.tgt_vocab_size is None and not c.output_bias
    d, ff = c.d_model, c.d_ff
    attention = 4 * (d * d + d)
    feed_forward = d * ff + ff + ff * d + d
    norm = 2 * d
    encoder = attention + feed_forward + 2 * norm
    decoder = 2 * attention + feed_forward + 3 * norm
    total = c.vocab_size * d + c.n_encoder_layers * encoder + c.n_decoder_layers * decoder
    return {"encoder layer (one)": encoder, "decoder layer (one)": decoder, "total": total}


def table(out: str) -> dict[str, int]:
    """The parameter rows of ``info``'s output: name -> count."""
    rows = out.split("\nparameters\n", 1)[1].splitlines()
    return {row[:22].strip(): int(row[22:].split()[0].replace(",", "")) for row in rows}


@pytest.mark.parametrize("preset, overrides", [
    ("base", []),
    ("big", []),
    ("tiny", ["d_ff=128", "n_decoder_layers=3", "vocab_size=500"]),
], ids=["base", "big", "tiny-with-overrides"])
def test_parameter_counts_equal_the_papers_formula(capsys, preset, overrides):
    r = cli(capsys, "info", "--preset", preset, *[a for o in overrides for a in ("--set", o)])
    assert r.code == 0 and r.err == "", r.err
    config = ModelConfig.from_preset(preset, **dict(
        (k, int(v)) for k, v in (o.split("=") for o in overrides)))
    expected = paper_count(config)
    got = table(r.out)
    assert {k: got[k] for k in expected} == expected
    assert f"  d_model              {config.d_model}\n" in r.out
    assert (f"{config.n_encoder_layers} encoder + {config.n_decoder_layers} decoder"
            in r.out)
    if preset == "base":
        assert expected["total"] == 63_082_496  # the figure usually quoted for the paper's base


@pytest.mark.parametrize("preset, kind", [("gpt-mini", "decoder"), ("bert-tiny", "encoder")])
def test_parameter_total_equals_the_built_models(capsys, preset, kind):
    r = cli(capsys, "info", "--preset", preset)
    assert r.code == 0 and r.err == "", r.err
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset(preset))
    unique = {id(p): p.numel() for p in model.parameters()}  # tied weights once
    assert table(r.out)["total"] == sum(unique.values())
    assert f"  architecture         {kind}\n" in r.out


@pytest.mark.parametrize("args, names", [
    (["--set", "no_such_field=1"], ["no_such_field"]),
    (["--hardware", "--device", "gpu9"], ["--device gpu9"]),
    (["--preset", "tiny", "--set", "positional=rope", "--set", "d_model=36", "--set",
      "n_heads=4"], ["positional='rope'", "d_k"]),
    (["--preset", "bert-tiny", "--set", "activation=swiglu"], ["swiglu"]),
], ids=["unknown-field", "unknown-device", "rope-odd-head-width", "bert-swiglu"])
def test_bad_input(capsys, args, names):
    r = cli(capsys, "info", *args)
    assert_bad_input(r, *names)
    assert r.out == ""
