"""``attnlab train translate | lm | mlm | classify``.

Covered elsewhere, not repeated here:

- train translate: happy path tests/training/test_trainer.py (the ``reference_run`` fixture
  and the tests using it), tests/training/test_evaluate.py::test_shared_bpe_training_and_evaluate,
  tests/training/test_precision.py::test_training_commands_say_what_auto_chose; bad input
  tests/training/test_trainer.py::test_bad_input_one_line_exit_2 (missing, misaligned and empty
  files, an unknown preset), ::test_nan_loss_stops_and_keeps_last_good_checkpoint,
  ::test_fresh_run_into_a_folder_with_checkpoints_is_refused,
  tests/training/test_precision.py::test_old_flags_warn_once_and_still_work.
- train lm: happy path tests/training/test_lm.py::test_lm_learns_and_reports_validation_loss;
  bad input ::test_train_lm_bad_settings_are_one_line_errors, ::test_train_lm_binary_file_is_named.
- train classify: happy path tests/tasks/test_classify.py::test_classify_cli_prints_labels;
  bad input ::test_bad_data_is_named.

Here: ``train mlm`` (happy path and bad input), and for all four an ``--out`` that cannot be
created.
"""

import json
import math

import pytest

from attnlab import ModelConfig
from attnlab.sentence_encoder import load_encoder
from attnlab.storage import list_checkpoints
from tests.cli.conftest import MLM_LINES, MLM_VOCAB
from tests.cli.helpers import assert_bad_input, cli, not_a_folder


def test_train_mlm_reports_validation_loss_and_saves_an_encoder(mlm_run):
    r, run = mlm_run.result, mlm_run.path
    assert r.code == 0 and r.err == "", r.err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [row["val_loss"] for row in rows if "val_loss" in row]
    assert rows[-1]["step"] == 2 and len(val) == 1  # --eval-every 2
    assert "device cpu, precision fp32" in r.out
    held_out = MLM_LINES // 20  # the last 5% of lines validate
    assert f"{MLM_LINES - held_out} training and {held_out} validation lines" in r.out
    assert f"validation masked-LM loss {val[-1]:.4f} after 2 steps" in r.out
    assert (run / "checkpoints" / "step-00000002" / "model.safetensors").exists()
    assert (run / "loss_curve.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    enc = load_encoder(run)
    config, tiny = enc.model.config, ModelConfig.from_preset("bert-tiny")
    assert (config.arch, config.d_model, config.n_encoder_layers, config.head) == (
        "encoder", tiny.d_model, tiny.n_encoder_layers, "mlm")
    vocab = enc.tokenizer.vocab_size
    assert vocab <= MLM_VOCAB and config.vocab_size == vocab
    # two steps from a random start: still about as unsure as a uniform guess over the vocabulary
    assert abs(val[-1] - math.log(vocab)) < 0.5, (val[-1], math.log(vocab))


def test_train_mlm_refuses_a_decoder_preset(capsys, mlm_run, tmp_path):
    r = cli(capsys, "train", "mlm", "--text", mlm_run.path.parent / "corpus.txt", "--preset",
            "gpt-mini", "--out", tmp_path / "run", "--no-progress", "--device", "cpu")
    assert_bad_input(r, "--preset gpt-mini")
    assert not (tmp_path / "run").exists()


def test_train_translate_refuses_a_decoder_preset(capsys, tmp_path):
    """The same preset/architecture check as train lm and train mlm."""
    r = cli(capsys, "train", "translate", "--task", "numbers", "--n-train", "50", "--preset",
            "gpt-mini", "--out", tmp_path / "run", "--no-progress", "--device", "cpu")
    assert_bad_input(r, "--preset gpt-mini")
    assert not (tmp_path / "run").exists()


def test_train_mlm_missing_text_file_is_named(capsys, tmp_path):
    missing = tmp_path / "nope.txt"
    r = cli(capsys, "train", "mlm", "--text", missing, "--preset", "bert-tiny", "--out",
            tmp_path / "run", "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert_bad_input(r, str(missing))


@pytest.mark.parametrize("kind", ["translate", "lm", "mlm", "classify"])
def test_out_that_cannot_be_created_is_named(capsys, tmp_path, mlm_run, kind):
    text = tmp_path / "text.txt"
    text.write_text("".join(f"alpha bravo charlie {i}\n" for i in range(100)))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"alpha {i}", "label": "ab"[i % 2]})
                            + "\n" for i in range(100)))
    inputs = {"translate": ["--task", "numbers", "--n-train", "50"],
              "lm": ["--text", text, "--set", "d_model=32", "--set", "n_heads=2",
                     "--set", "d_ff=64", "--set", "n_decoder_layers=1", "--block", "8"],
              "mlm": ["--text", text, "--preset", "bert-tiny", "--vocab-size", "40"],
              "classify": ["--data", data, "--text-field", "text", "--label-field", "label",
                           "--init", mlm_run.path]}[kind]
    out = not_a_folder(tmp_path)
    r = cli(capsys, "train", kind, *inputs, "--steps", "2", "--out", out, "--no-progress",
            "--device", "cpu", "--precision", "fp32")
    assert_bad_input(r, str(out.parent))


def test_train_lm_block_beyond_the_text_or_the_memory_is_named(capsys, tmp_path, monkeypatch):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be. " * 50)
    common = ["train", "lm", "--text", text, "--out", tmp_path / "run", "--no-progress",
              "--device", "cpu", "--steps", "2"]
    r = cli(capsys, *common, "--block", "100000000")
    assert "the training text has only" in assert_bad_input(r, "--block 100000000")
    from attnlab import hardware

    monkeypatch.setattr(hardware, "available_memory", lambda device=None: 2**20)  # 1 MB
    r = cli(capsys, *common, "--block", "64")
    assert "training needs about" in assert_bad_input(r, "--block 64 --batch 12")
    assert not list_checkpoints(tmp_path / "run" / "checkpoints")
