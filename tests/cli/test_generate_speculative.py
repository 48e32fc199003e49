"""``attnlab generate --draft MODEL`` and ``--prompt-lookup``: plain greedy's text, one more
line on stderr, and one-line errors for the flags that do not go with them.

The run is the character-level ``lm_run`` (trained with --block 16): "to be" and 12 new tokens
fill its context exactly (the last token is never fed)."""

import json
import re
import shutil

import pytest

from tests.cli.helpers import assert_bad_input, cli

BASE = ["--prompt", "to be", "--max-new-tokens", "12", "--ignore-eos", "--device", "cpu",
        "--precision", "fp32"]
SUMMARY = re.compile(r"speculative: drafted (\d+), accepted (\d+) \((\d+)%\), "
                     r"(\d+) target forwards")


def generate(capsys, run, *flags):
    r = cli(capsys, "generate", "--model", run, *BASE, *flags)
    assert r.code == 0, r.err
    return r


def test_prompt_lookup_and_a_draft_print_greedy_text(capsys, lm_run):
    plain = generate(capsys, lm_run, "--quiet")
    for flags in (["--prompt-lookup"], ["--prompt-lookup", "--draft-tokens", "3",
                                        "--lookup-ngram", "1"],
                  ["--draft", str(lm_run)], ["--draft", str(lm_run), "--draft-tokens", "2"]):
        r = generate(capsys, lm_run, *flags)
        assert r.out == plain.out, flags
        running, timing, summary = r.err.splitlines()
        assert running.startswith("attnlab generate: running ") and timing.startswith("timing: ")
        drafted, accepted, _, forwards = map(int, SUMMARY.fullmatch(summary).groups())
        assert accepted <= drafted and forwards + accepted == 12
        if "--draft" in flags:  # the model drafting for itself: every guess is right
            assert " with draft " in running and accepted == drafted > 0
        quiet = generate(capsys, lm_run, *flags, "--quiet")
        assert quiet.out == plain.out and quiet.err == ""


def test_stop_strings_cut_the_text_where_plain_decoding_does(capsys, lm_run):
    """The stop string is the middle character of what plain decoding makes (whatever the
    2-step model makes on this CPU, its first occurrence lies in the first half of the text:
    the cut is real, N tokens in). Lookup and a draft guess two tokens at a time; their text
    stops where plain decoding's does, after the same N tokens fed to the stop check (the
    timing line's count), and decoding stops with them: at most the two guesses past N."""
    plain = generate(capsys, lm_run, "--quiet")
    made = plain.out[len("to be") : -1]
    assert len(made) >= 2, f"12 tokens made the text {made!r}"
    stop = made[len(made) // 2]
    cut = generate(capsys, lm_run, "--stop", stop)
    assert cut.out == plain.out[: len("to be") + made.index(stop)] + "\n"
    tokens = int(re.search(r"generated (\d+) tokens", cut.err).group(1))
    assert tokens + 2 < 12  # the premise: the stop comes in the first half
    for flags in (["--prompt-lookup"], ["--draft", str(lm_run)]):
        r = generate(capsys, lm_run, "--stop", stop, "--draft-tokens", "2", *flags)
        assert r.out == cut.out, flags
        _, timing, summary = r.err.splitlines()
        assert re.search(r"generated (\d+) tokens", timing).group(1) == str(tokens), flags
        _, accepted, _, forwards = map(int, SUMMARY.fullmatch(summary).groups())
        assert tokens <= forwards + accepted <= tokens + 2, flags


@pytest.mark.parametrize("flags, names", [
    (["--prompt-lookup", "--draft", "RUN"], ["--draft", "--prompt-lookup"]),
    (["--prompt-lookup", "--temperature", "0.8"], ["--prompt-lookup", "--temperature"]),
    (["--draft", "RUN", "--repetition-penalty", "1.3"], ["--draft", "--repetition-penalty"]),
    (["--prompt-lookup", "--draft-tokens", "0"], ["--draft-tokens", ">= 1"]),
    (["--prompt-lookup", "--lookup-ngram", "0"], ["--lookup-ngram", ">= 1"]),
    (["--draft-tokens", "3"], ["--draft-tokens", "--draft or --prompt-lookup"]),
    (["--lookup-ngram", "2"], ["--lookup-ngram", "--prompt-lookup"]),
    (["--draft-int4"], ["--draft-int4", "--draft"]),
    (["--prompt-lookup", "--max-new-tokens", "13"], ["context of 16", "at most 12 new tokens"]),
])
def test_flags_that_do_not_go_together_are_one_line_errors(capsys, lm_run, flags, names):
    flags = [str(lm_run) if f == "RUN" else f for f in flags]
    r = cli(capsys, "generate", "--model", lm_run, *BASE, *flags)
    assert_bad_input(r, *names)
    assert r.out == ""  # refused before the prompt is echoed


def test_a_draft_with_another_token_table_is_refused(capsys, lm_run, tmp_path):
    """The same weights beside a tokenizer with two tokens swapped, or one token more."""
    newest = sorted((lm_run / "checkpoints").iterdir())[-1]
    for name, change in [("swapped", lambda v: v[:4] + [v[5], v[4]] + v[6:]),
                         ("longer", lambda v: v + ["§"])]:
        draft = tmp_path / name
        shutil.copytree(newest, draft)
        tokenizers = json.loads((draft / "tokenizers.json").read_text())
        tokenizers["text"]["vocab"] = change(tokenizers["text"]["vocab"])
        (draft / "tokenizers.json").write_text(json.dumps(tokenizers))
        r = cli(capsys, "generate", "--model", lm_run, *BASE, "--draft", draft)
        line = assert_bad_input(r, f"--draft {draft}", "share the model's tokenizer")
        assert ("token 4 is" in line) if name == "swapped" else ("tokens, the model's" in line)
