"""``attnlab train qa`` and ``attnlab qa`` on a synthetic SQuAD file: the run's score is the
one its final model gives, ``qa`` answers with a span of the context, and bad input is one
line."""

import json
import random
import re

import pytest

from attnlab import load
from attnlab.tasks.qa import answer_many, squad_scores
from tests.cli.helpers import assert_bad_input, cli, cli_captured, tiny_bert

NAMES = ["anna", "boris", "clara", "dmitri"]
TOWNS = ["paris", "lagos", "quito", "oslo"]


def article(rng: random.Random, n: int) -> dict:
    paragraphs = []
    for p in range(3):
        who, town = rng.choice(NAMES), rng.choice(TOWNS)
        context = f"in the spring {who} travelled to {town} and stayed there for a week ."
        paragraphs.append({"context": context, "qas": [
            {"id": f"{n}-{p}-w", "question": "who travelled ?",
             "answers": [{"text": who, "answer_start": context.index(who)}]},
            {"id": f"{n}-{p}-t", "question": "where did they travel to ?",
             "answers": [{"text": town, "answer_start": context.index(town)}]}]})
    return {"title": f"a{n}", "paragraphs": paragraphs}


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa")
    rng = random.Random(0)
    squad = folder / "squad.json"
    squad.write_text(json.dumps({"data": [article(rng, n) for n in range(6)]}))
    (folder / "corpus.txt").write_text(
        " ".join(NAMES + TOWNS) + " in the spring travelled to and stayed there for a week . "
        "who where did they travel ?\n")
    tiny_bert(folder / "corpus.txt", folder / "encoder", vocab_size=100, max_len=32)
    run = folder / "run"
    r = cli_captured("train", "qa", "--data", squad, "--train-articles", "0-3",
                     "--eval-articles", "4-5", "--model", folder / "encoder", "--out", run,
                     "--max-len", "24", "--stride", "6", "--steps", "20", "--batch", "8",
                     "--eval-every", "10", "--no-progress", "--device", "cpu", "--precision",
                     "fp32")
    assert r.code == 0, r.err
    return run, squad, r.out


def test_the_runs_score_is_its_final_models(qa_run):
    from attnlab.tasks.qa import read_squad

    run, squad, out = qa_run
    found = re.search(r"held-out articles: exact match (\S+), F1 (\S+) on 12 questions", out)
    assert found, out
    model = load(run)
    questions = read_squad(squad, range(4, 6))
    answers = answer_many(model.model, model.tokenizer,
                          [(q.question, q.context) for q in questions], 24, 6)
    em, f1 = squad_scores([a for a, *_ in answers], [list(q.answers) for q in questions])
    assert (f"{em:.2f}", f"{f1:.2f}") == (found[1], found[2])


def test_qa_answers_with_a_span_of_the_context(capsys, tmp_path, qa_run):
    run, _, _ = qa_run
    context = "in the spring clara travelled to oslo and stayed there for a week ."
    (tmp_path / "context.txt").write_text(context)
    r = cli(capsys, "qa", "--model", run, "--context", tmp_path / "context.txt", "--json",
            "who travelled ?", "--quiet")
    assert r.code == 0, r.err
    got = json.loads(r.out)
    assert got["answer"] and context[got["start"] : got["end"]] == got["answer"]


@pytest.mark.parametrize("flags, question, says", [
    (["--stride", "20"], "who travelled ?", "--stride 20"),
    (["--max-len", "4000"], "who travelled ?", "--max-len 4000"),
    (["--max-answer-len", "0"], "who travelled ?", "--max-answer-len"),
    ([], "who travelled to oslo and stayed there " * 3, "cannot hold it"),
])
def test_windows_that_cannot_be_read_are_one_line(capsys, tmp_path, qa_run, flags, question,
                                                  says):
    """Bad window options, and a question that leaves no room for the context in the run's
    windows (24 tokens, stride 6)."""
    run, _, _ = qa_run
    (tmp_path / "context.txt").write_text("clara travelled to oslo .")
    r = cli(capsys, "qa", "--model", run, "--context", tmp_path / "context.txt", *flags,
            question)
    assert_bad_input(r, says, while_running=True)


def test_overlapping_article_ranges_are_refused(capsys, tmp_path, qa_run):
    _, squad, _ = qa_run
    r = cli(capsys, "train", "qa", "--data", squad, "--train-articles", "0-3",
            "--eval-articles", "3-5", "--out", tmp_path / "run", "--no-progress")
    assert_bad_input(r, "overlap")


def test_a_file_that_is_not_squad_is_named(capsys, tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"notes": []}')
    r = cli(capsys, "train", "qa", "--data", path, "--out", tmp_path / "run", "--no-progress")
    assert_bad_input(r, str(path), "not a SQuAD file")
