"""``attnlab generate``: a model that is missing or cannot generate.

Covered elsewhere, not repeated here:

- happy path: tests/training/test_lm.py::test_generate_streams_and_stops (greedy, ``--stop``,
  ``--truncate``), ::test_generate_bad_flags_and_empty_prompt (an empty prompt),
  ::test_generate_int4_runs_a_trained_run;
- bad input: tests/training/test_lm.py::test_generate_bad_flags_and_empty_prompt (``--top-p 1.5``,
  exact stderr; ``--max-new-tokens`` filling the context), ::test_generate_streams_and_stops (a
  prompt longer than the context).
"""

import sys

from tests.cli.helpers import assert_bad_input, cli


def test_missing_model_is_named(capsys, tmp_path):
    missing = tmp_path / "no-such-run"
    r = cli(capsys, "generate", "--model", missing, "--prompt", "forty", "--device", "cpu")
    assert_bad_input(r, str(missing))
    assert r.out == ""


def test_an_encoder_only_model_is_refused(capsys, mlm_run):
    """A BERT (``train mlm``) has no causal decoder: one line naming it, not a traceback."""
    r = cli(capsys, "generate", "--model", mlm_run.path, "--prompt", "alpha bravo",
            "--max-new-tokens", "4", "--device", "cpu", "--precision", "fp32")
    line = assert_bad_input(r)
    assert str(mlm_run.path) in line or "encoder" in line, line
    assert r.out == ""  # refused before the prompt is echoed


def test_a_gguf_file_without_the_gguf_package_is_named(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    r = cli(capsys, "generate", "--model", model, "--prompt", "hi", "--device", "cpu")
    assert_bad_input(r, str(model), "attnlab[gguf]")


def test_prompt_symbols_outside_the_vocabulary_are_named(capsys, lm_run):
    """A character vocabulary learned from lower-case English lacks 'Z' and '€': they are
    read as <unk>, with one warning naming them, and generation goes on."""
    r = cli(capsys, "generate", "--model", lm_run, "--prompt", "to Z€ be", "--max-new-tokens",
            "3", "--device", "cpu")
    assert r.code == 0 and r.out.startswith("to Z€ be")
    assert r.err.strip().splitlines() == [
        "attnlab: warning: --prompt: 2 symbol(s) not in the model's vocabulary, read as <unk>: "
        "'Z' '€'"]
