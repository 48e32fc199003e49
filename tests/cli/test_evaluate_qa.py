"""``attnlab evaluate qa``: SQuAD's exact match and F1 of a briefly trained run on a synthetic
SQuAD file equal an independent implementation of SQuAD v1.1's definitions (written here)
applied to the model's own answers, and the held-out score ``train qa`` printed; bad input is
one line."""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter

import pytest

from attnlab import load
from attnlab.tasks.qa import answer_many, read_squad
from tests.cli.helpers import assert_bad_input, cli, cli_captured, tiny_bert
from tests.cli.test_qa import NAMES, TOWNS, article


# --- SQuAD v1.1's evaluate script, from its definitions --------------------------------------
def normalise(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in string.punctuation)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def token_f1(prediction: str, truth: str) -> float:
    p, t = normalise(prediction).split(), normalise(truth).split()
    common = Counter(p) & Counter(t)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


def squad(predictions: list[str], truths: list[tuple[str, ...]]) -> tuple[float, float]:
    em = sum(max(float(normalise(p) == normalise(t)) for t in ts)
             for p, ts in zip(predictions, truths, strict=True))
    f1 = sum(max(token_f1(p, t) for t in ts) for p, ts in zip(predictions, truths, strict=True))
    return 100 * em / len(predictions), 100 * f1 / len(predictions)


def test_the_reference_by_hand():
    # "The Eiffel tower!" is "eiffel tower": exact; "tower in paris" vs "eiffel tower":
    # 1 shared word, P = 1/3, R = 1/2, F1 = 0.4; against "Tower" alone P = 1/3, R = 1: 0.5
    em, f1 = squad(["The Eiffel tower!", "tower in paris"],
                   [("eiffel tower",), ("eiffel tower", "Tower")])
    assert em == pytest.approx(50.0)
    assert f1 == pytest.approx(100 * (1 + 0.5) / 2)


def with_longer_answers(article: dict) -> dict:
    """"where" questions also accept "travelled to TOWN", so that a partly right answer
    ("to", "to oslo and") has an F1 between 0 and 1, and the best of two answers counts."""
    for paragraph in article["paragraphs"]:
        context = paragraph["context"]
        for qa in paragraph["qas"]:
            if qa["question"].startswith("where"):
                town = qa["answers"][0]["text"]
                qa["answers"].append({"text": f"travelled to {town}",
                                      "answer_start": context.index("travelled")})
    return article


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    """tests/cli/test_qa.py's set-up, with two answers to "where": 6 articles of 3
    paragraphs, bert-tiny trained 40 steps on articles 0-3 with windows of 24 tokens, stride
    6: a third of the held-out questions right on the developer's CPU."""
    folder = tmp_path_factory.mktemp("evaluate_qa")
    rng = random.Random(0)
    data = folder / "squad.json"
    data.write_text(json.dumps({"data": [with_longer_answers(article(rng, n))
                                         for n in range(6)]}))
    (folder / "corpus.txt").write_text(
        " ".join(NAMES + TOWNS) + " in the spring travelled to and stayed there for a week . "
        "who where did they travel ?\n")
    tiny_bert(folder / "corpus.txt", folder / "encoder", vocab_size=100, max_len=32)
    run = folder / "run"
    r = cli_captured("train", "qa", "--data", data, "--train-articles", "0-3",
                     "--eval-articles", "4-5", "--model", folder / "encoder", "--out", run,
                     "--max-len", "24", "--stride", "6", "--steps", "40", "--lr", "1e-3",
                     "--batch", "8", "--eval-every", "10", "--no-progress", "--device", "cpu",
                     "--precision", "fp32")
    assert r.code == 0, r.err
    return run, data, r.out


@pytest.mark.parametrize("articles", [None, "4-5"])
def test_evaluate_qa_is_squads_score_of_the_models_answers(capsys, qa_run, articles):
    run, data, trained = qa_run
    flags = ["--articles", articles] if articles else []
    r = cli(capsys, "evaluate", "qa", "--model", run, "--data", data, *flags, "--device", "cpu",
            "--precision", "fp32")  # as the test's own answers: bf16 could move a span
    assert r.code == 0, r.err
    questions = read_squad(data, range(4, 6) if articles else None)
    model = load(run)
    found = answer_many(model.model, model.tokenizer,
                        [(q.question, q.context) for q in questions], 24, 6)
    predictions = [text for text, *_ in found]
    em, f1 = squad(predictions, [q.answers for q in questions])
    assert 0 < f1 < 100, f"answers too good or too bad to tell scores apart: {predictions}"
    which = f" of articles {articles}" if articles else ""
    assert f"{data}: {len(questions)} questions{which}; windows of 24 tokens, stride 6" in r.out
    assert f"exact match {em:.2f}, F1 {f1:.2f}" in r.out
    if articles:  # the held-out articles: what training printed at its end
        assert f"exact match {em:.2f}, F1 {f1:.2f} on {len(questions)} questions" in trained


@pytest.mark.parametrize("case", ["missing file", "not squad", "not a qa model", "articles",
                                  "max answer"])
def test_bad_input_is_one_line(capsys, tmp_path, qa_run, case):
    run, data, _ = qa_run
    flags = {"--model": run, "--data": data}
    if case == "missing file":
        flags["--data"] = tmp_path / "nowhere.json"
        names: tuple[str, ...] = (str(flags["--data"]), "not found")
    elif case == "not squad":
        flags["--data"] = tmp_path / "notes.json"
        flags["--data"].write_text('{"notes": []}')
        names = (str(flags["--data"]), "not a SQuAD file")
    elif case == "not a qa model":
        flags["--model"] = data.parent / "encoder"
        names = ("head='none'", "train qa")
    elif case == "articles":
        flags["--articles"] = "5-4"
        names = ("5-4",)
    else:
        flags["--max-answer-len"] = "0"
        names = ("--max-answer-len",)
    r = cli(capsys, "evaluate", "qa", *[x for pair in flags.items() for x in pair])
    assert_bad_input(r, *names, while_running=True)
