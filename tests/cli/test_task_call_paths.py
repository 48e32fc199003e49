"""Each task's commands run task code only from that task's module: of attnlab/tasks/, ``ner``,
``train ner`` and ``evaluate ner`` call functions only in tasks/ner/ (and the start every task
shares, tasks/pretrained.py), and likewise ``qa`` and ``train qa`` in tasks/qa/, ``classify``
and ``train classify`` in tasks/classify/, ``train choice`` and ``evaluate choice`` (on a
language model and on a multiple-choice head) in tasks/choice/. Traced as
tests/call_path.py traces a command, on tiny runs of a random bert-tiny (2 training steps)."""

from __future__ import annotations

import json
import random

import pytest

from tests.call_path import trace
from tests.cli.helpers import tiny_bert

TASKS = "attnlab/tasks/"
SHARED = {"attnlab/tasks/pretrained.py"}  # the start from a pretrained encoder
HOME = {"ner": "attnlab/tasks/ner/", "qa": "attnlab/tasks/qa/",
        "classify": "attnlab/tasks/classify/", "choice": "attnlab/tasks/choice/"}
TINY = ["--device", "cpu", "--precision", "fp32"]
TRAIN = ["--steps", "2", "--batch", "8", "--eval-every", "2", "--no-progress", *TINY]

NAMES = ["anna", "boris", "clara"]
TOWNS = ["paris", "lagos", "oslo"]
WORDS = ["went", "to", "see", "the", "film", "was", "great", "awful", "who", "travelled",
         "in", "spring", "and", "stayed", "there", "?", "."]


def check(files: dict[str, list[str]], task: str) -> None:
    """The task's own module ran, and no other task's."""
    called = sorted(f for f in files["called"] if f.startswith(TASKS))
    home = HOME[task]
    assert any(f.startswith(home) for f in called), called
    assert [f for f in called if not f.startswith(home) and f not in SHARED] == [], called


def run(capsys, *argv) -> dict[str, list[str]]:
    code, files = trace([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return files


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A random bert-tiny with a WordPiece vocabulary of the words below, as a HF folder."""
    folder = tmp_path_factory.mktemp("encoder")
    (folder / "corpus.txt").write_text(" ".join(NAMES + TOWNS + WORDS) + "\n")
    return tiny_bert(folder / "corpus.txt", folder / "model", vocab_size=60, max_len=32)


@pytest.fixture(scope="module")
def ner(tmp_path_factory, encoder):
    """``train ner`` traced: (its files, the run, the test file)."""
    folder = tmp_path_factory.mktemp("ner")
    rng = random.Random(0)
    for split, n in (("train", 16), ("dev", 4), ("test", 4)):
        sentences = [[(rng.choice(NAMES).title(), "B-PER"), ("went", "O"), ("to", "O"),
                      (rng.choice(TOWNS).title(), "B-LOC")] for _ in range(n)]
        (folder / f"{split}.txt").write_text("\n\n".join(
            "\n".join(f"{w} {t}" for w, t in s) for s in sentences) + "\n")
    files = trace_train(["train", "ner", "--data", folder, "--model", encoder, "--out",
                         folder / "run", "--max-len", "32"])
    return files, folder / "run", folder / "test.txt"


def trace_train(argv: list) -> dict[str, list[str]]:
    code, files = trace([str(a) for a in [*argv, *TRAIN]])
    assert code == 0
    return files


def test_train_ner(ner):
    check(ner[0], "ner")


def test_ner(capsys, ner):
    check(run(capsys, "ner", "--model", ner[1], *TINY, "Anna went to Paris"), "ner")


def test_evaluate_ner(capsys, ner):
    check(run(capsys, "evaluate", "ner", "--model", ner[1], "--data", ner[2], *TINY), "ner")


@pytest.fixture(scope="module")
def qa(tmp_path_factory, encoder):
    """``train qa`` traced: (its files, the run, a context file)."""
    folder = tmp_path_factory.mktemp("qa")
    articles = []
    for n, (who, town) in enumerate(zip(NAMES, TOWNS, strict=False)):
        context = f"in spring {who} travelled to {town} and stayed there ."
        articles.append({"title": f"a{n}", "paragraphs": [{"context": context, "qas": [
            {"id": f"{n}", "question": "who travelled ?",
             "answers": [{"text": who, "answer_start": context.index(who)}]}]}]})
    (folder / "squad.json").write_text(json.dumps({"data": articles}))
    (folder / "context.txt").write_text(articles[0]["paragraphs"][0]["context"])
    files = trace_train(["train", "qa", "--data", folder / "squad.json", "--train-articles",
                         "0-1", "--eval-articles", "2-2", "--model", encoder, "--out",
                         folder / "run", "--max-len", "24", "--stride", "6"])
    return files, folder / "run", folder / "context.txt"


def test_train_qa(qa):
    check(qa[0], "qa")


def test_qa(capsys, qa):
    check(run(capsys, "qa", "--model", qa[1], "--context", qa[2], *TINY, "who travelled ?"),
          "qa")


@pytest.fixture(scope="module")
def classify(tmp_path_factory, encoder):
    """``train classify`` traced: (its files, the run)."""
    folder = tmp_path_factory.mktemp("classify")
    rng = random.Random(0)
    rows = [{"id": f"r{i}", "text": f"the film was {label}", "label": label}
            for i, label in enumerate(rng.choice(["great", "awful"]) for _ in range(40))]
    (folder / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = trace_train(["train", "classify", "--data", folder / "reviews.jsonl",
                         "--text-field", "text", "--label-field", "label", "--init", encoder,
                         "--out", folder / "run", "--max-len", "16"])
    return files, folder / "run"


def test_train_classify(classify):
    check(classify[0], "classify")


def test_classify(capsys, classify):
    check(run(capsys, "classify", "--model", classify[1], *TINY, "the film was great"),
          "classify")


def test_evaluate_choice(capsys, tmp_path, lm_run):
    data = tmp_path / "questions.jsonl"  # the character LM's own letters
    data.write_text(json.dumps({"context": "to be or", "choices": ["not to be", "that is"],
                                "answer": 0}) + "\n")
    check(run(capsys, "evaluate", "choice", "--model", lm_run, "--data", data, *TINY),
          "choice")


@pytest.fixture(scope="module")
def choice_head(tmp_path_factory, encoder):
    """``train choice`` traced: (its files, the run, the questions)."""
    folder = tmp_path_factory.mktemp("choice")
    rows = [{"context": f"who went to {town} ?", "choices": [NAMES[i % 3], NAMES[(i + 1) % 3]],
             "answer": i % 2} for i, town in enumerate(TOWNS * 4)]
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = trace_train(["train", "choice", "--data", data, "--model", encoder, "--out",
                         folder / "run", "--max-len", "16", "--valid", data])
    return files, folder / "run", data


def test_train_choice(choice_head):
    check(choice_head[0], "choice")


def test_evaluate_choice_on_a_multiple_choice_head(capsys, choice_head):
    check(run(capsys, "evaluate", "choice", "--model", choice_head[1], "--data", choice_head[2],
              *TINY), "choice")
