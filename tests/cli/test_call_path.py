"""The short call path of docs/architecture.md: inference runs code in a handful of attnlab files
outside nn/ and the CPU engine (cpu/) (translate 11, generate 12), never in training/, data/ or
tasks/, in no other command's module, and never calls back up into cli/ from the decoding
layers.

(The design's target was 10 for both. Reading a model folder's config.json goes through
files.py, the one reader of the files users give, which the config module no longer holds: one
file more on every path that loads a model. generate also runs its decoding pipeline,
generation/pipeline.py, beside the loop. docs/architecture.md lists the files of each.)"""

from __future__ import annotations

from tests.call_path import trace

INFERENCE_FORBIDDEN = ("attnlab/training/", "attnlab/data/", "attnlab/tasks/")


def _check(files: dict[str, list[str]], command_module: str, most: int) -> None:
    called = files["called"]
    assert len(called) <= most, called
    assert not [f for f in called if f.startswith(INFERENCE_FORBIDDEN)], called
    assert files["climbs_back"] == []
    cli = [f for f in called if f.startswith("attnlab/cli/")]
    assert sorted(cli) == ["attnlab/cli/__init__.py", "attnlab/cli/common.py", command_module]


def test_translate_runs_in_at_most_eleven_files(translation_run, capsys):
    code, files = trace(["translate", "--model", str(translation_run.path), "ein Satz"])
    assert code == 0 and len(capsys.readouterr().out.splitlines()) == 1
    _check(files, "attnlab/cli/translate.py", 11)


def test_generate_runs_in_at_most_twelve_files(lm_run, capsys):
    code, files = trace(["generate", "--model", str(lm_run), "--prompt", "to be",
                         "--max-new-tokens", "5", "--device", "cpu"])
    assert code == 0 and capsys.readouterr().out.startswith("to be")
    _check(files, "attnlab/cli/generate.py", 12)


def test_speculative_generate_never_calls_back_into_the_cli(lm_run, capsys):
    """Speculative steps bring several tokens at once; the decoding pipeline feeds them to the
    text stream itself (a callback into cli/generate.py did that before)."""
    code, files = trace(["generate", "--model", str(lm_run), "--prompt", "to be to be",
                         "--max-new-tokens", "6", "--device", "cpu", "--prompt-lookup"])
    assert code == 0 and capsys.readouterr().out.startswith("to be to be")
    _check(files, "attnlab/cli/generate.py", 13)  # and generation/speculative.py
