"""``attnlab explain --examples`` and ``--example NAME``: the list, one example end to end,
and bad input (an unknown name, a sentence or a model given with them). The numbers are
tested in tests/explain/test_examples.py."""

import pytest

from attnlab.explain.examples import list_examples, run_example
from tests.cli.helpers import assert_bad_input, cli

NAMES = [e.name for e in list_examples()]


def test_examples_lists_each_with_its_course_file(capsys):
    r = cli(capsys, "explain", "--examples")
    assert r.code == 0, r.err
    for e in list_examples():
        assert e.name in r.out and e.source in r.out


@pytest.mark.parametrize("name", ["tiny-attention", "forward-pass"])
def test_example_prints_every_step_and_passes_its_checks(capsys, name):
    r = cli(capsys, "explain", "--example", name)
    assert r.code == 0, r.err
    result = run_example(name)
    assert all(s.name in r.out for s in result.steps)
    assert r.out.count("→ OK") == len(result.checks) and "FAILED" not in r.out
    assert all(p.why in r.out for p in result.discrepancies)


def test_an_unknown_example_is_one_line_naming_the_known_ones(capsys):
    r = cli(capsys, "explain", "--example", "no-such-example")
    assert_bad_input(r, "no-such-example", *NAMES)
    assert r.out == ""


@pytest.mark.parametrize("flags, extra, named", [
    (["--example", "softmax"], ["the cat sat"], ["--example", "sentence"]),
    (["--example", "softmax"], ["--model", "minilm"], ["--example", "--model"]),
    (["--examples"], ["the cat sat"], ["--examples", "sentence"]),
    (["--examples"], ["--model", "minilm"], ["--examples", "--model"]),
])
def test_examples_refuse_a_sentence_or_a_model(capsys, flags, extra, named):
    r = cli(capsys, "explain", *flags, *extra)
    assert_bad_input(r, *named)
    assert r.out == ""
