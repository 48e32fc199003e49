"""``attnlab explain`` on an encoder–decoder: through the decoder and the output stage to the
translation, equal to ``attnlab translate``'s; the output stage's flags and their bad values."""

import re

import pytest

from tests.cli.helpers import assert_bad_input, cli_captured


def _passed(out: str) -> tuple[int, int]:
    found = re.search(r"(\d+) of (\d+) checks passed", out)
    return int(found[1]), int(found[2])


def test_translation_run_walks_to_translates_answer(translation_run):
    run = translation_run.path
    r = cli_captured("explain", "--model", run, "forty-two", "--layer", "1", "--head", "3")
    assert r.code == 0, r.err
    passed, total = _passed(r.out)
    assert passed == total > 20
    for heading in ("memory", "cross-attention: attention weights", "output: probabilities",
                    "generation, step by step"):
        assert heading in r.out
    built = re.search(r"translation, built token by token: '(.*)'", r.out)[1]
    t = cli_captured("translate", "--model", run, "forty-two", "--precision", "fp32")
    assert t.code == 0 and t.out.strip() == built


def test_target_prefix_and_teacher_forcing(translation_run):
    r = cli_captured("explain", "--model", translation_run.path, "forty-two", "--target", "4",
                     "--steps", "2")
    assert r.code == 0, r.err
    assert "teacher forcing: each position's logits equal step-by-step decoding's" in r.out
    assert "step 2 " in r.out and "step 3 " not in r.out
    passed, total = _passed(r.out)
    assert passed == total


def test_sampling_is_reproducible_with_its_seed(translation_run):
    argv = ["explain", "--model", translation_run.path, "forty-two", "--temperature", "1.5",
            "--top-k", "5", "--sample-seed", "11", "--steps", "4"]
    a, b = cli_captured(*argv), cli_captured(*argv)
    assert a.code == b.code == 0 and a.out == b.out
    assert "a draw from p (torch.multinomial, --sample-seed 11)" in a.out
    assert "output: logits / T" in a.out


@pytest.mark.parametrize("flags, names", [
    (["--temperature", "-1"], ["--temperature"]),
    (["--temperature", "1", "--top-p", "1.5"], ["--top-p"]),
    (["--temperature", "1", "--top-k", "0"], ["--top-k"]),
    (["--top-k", "3"], ["--top-k"]),
])
def test_bad_sampling_values(flags, names):
    assert_bad_input(cli_captured("explain", "a b c", *flags), *names)


@pytest.mark.parametrize("flags, name", [(["--target", "x"], "--target"),
                                         (["--steps", "3"], "--steps")])
def test_target_and_steps_need_a_decoder(mlm_run, flags, name):
    r = cli_captured("explain", "--model", mlm_run.path, "alpha bravo", *flags)
    assert_bad_input(r, name, while_running=True)


def test_help_names_the_flags():
    r = cli_captured("explain", "--help")
    for flag in ("--target", "--steps", "--temperature", "--top-k", "--top-p", "--sample-seed"):
        assert flag in r.out
    assert "decoder" in r.out.split("--layer", 1)[1]
