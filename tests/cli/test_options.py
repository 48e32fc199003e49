"""What a mistyped command line gets: one line naming the problem and exit code 2, with the
nearest known option for a misspelt one; no abbreviation is taken for an option (argparse's
default would read ``--max-new-tok 5`` as ``--max-new-tokens 5`` without a word)."""

from __future__ import annotations

import pytest

from tests.cli.helpers import cli


@pytest.mark.parametrize("argv, line", [
    (["generate", "--promt", "hi"],
     "attnlab generate: error: unknown option --promt; did you mean --prompt?"),
    (["generate", "--model", "m", "--prompt", "hi", "--temprature", "0.8"],
     "attnlab generate: error: unknown option --temprature; did you mean --temperature?"),
    (["generate", "--model", "m", "--prompt", "hi", "--max-new-tok", "5"],
     "attnlab generate: error: unknown option --max-new-tok; did you mean --max-new-tokens?"),
    (["train", "lm", "--stepz=3"],
     "attnlab train lm: error: unknown option --stepz; did you mean --steps?"),
    (["--verison"], "attnlab: error: unknown option --verison; did you mean --version?"),
    (["translate", "--model", "m", "--zzz"],
     "attnlab translate: error: unknown option --zzz (see attnlab translate --help)"),
    (["generate", "--model", "m"],
     "attnlab generate: error: the following arguments are required: --prompt"),
    (["translate", "--model", "m", "--beam", "two"],
     "attnlab translate: error: argument --beam: invalid int value: 'two'"),
])
def test_a_mistyped_command_line_gets_one_line(capsys, argv, line):
    r = cli(capsys, *argv)
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == line


def test_text_after_a_double_dash_is_not_an_option(capsys):
    """``--`` ends the options: what follows is text, even if it looks like one."""
    r = cli(capsys, "translate", "--model", "/nonexistent/run", "--", "--not-an-option")
    assert r.code == 2 and "unknown option" not in r.err and "/nonexistent/run" in r.err


def test_empty_sentences_are_refused_before_any_model_loads(capsys):
    r = cli(capsys, "translate", "--model", "/nonexistent/run", "ein Satz", " ")
    assert r.code == 2 and r.err.strip() == ("attnlab translate: error: sentence 2 is empty: "
                                             "give the text to translate")


def test_the_wrong_kind_of_model_points_to_its_command(capsys, lm_run):
    r = cli(capsys, "translate", "--model", str(lm_run), "hello")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "arch='decoder' is not a translation model" in r.err
    assert r.err.strip().endswith("try 'attnlab generate'")


@pytest.mark.parametrize("name, hint", [("minlm", "(did you mean minilm?)"),
                                        ("smollm", "(did you mean smollm2?)"),
                                        ("nothing", "(the packaged models are minilm, smollm2)")])
def test_a_misspelt_packaged_model_is_named(capsys, name, hint):
    r = cli(capsys, "generate", "--model", name, "--prompt", "hi")
    assert r.code == 2
    assert r.err.strip() == f"attnlab generate: error: model not found: {name} {hint}"


def test_a_missing_text_file_is_named_before_anything_runs(capsys, tmp_path):
    """One line, and nothing before it: not the line saying which device will train."""
    r = cli(capsys, "train", "lm", "--text", str(tmp_path / "missing.txt"), "--steps", "1",
            "--out", str(tmp_path / "run"))
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == f"attnlab train: error: {tmp_path / 'missing.txt'}: no such text file"
