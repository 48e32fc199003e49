"""``attnlab train choice`` and ``evaluate choice`` on an encoder: a multiple-choice head
fine-tuned on the JSON lines ``evaluate choice`` reads learns a trivially separable rule (the
one colour among animals) to a stated criterion, and ``evaluate choice`` prints the accuracy
that transformers' BertForMultipleChoice computes from the same weights, fed by
BertTokenizerFast's pair encoding; questions of different numbers of choices share a batch
without changing their logits; bad input is one line."""

import json
import random

import pytest
import torch
import transformers

import attnlab
from attnlab.sentence_encoder import load_encoder
from attnlab.tasks.choice import read_examples
from attnlab.tasks.choice.head import collate_questions, question_rows, score_questions
from attnlab.tasks.choice.recipe import Choose
from tests.cli.helpers import assert_bad_input, cli, cli_captured
from tests.tasks.pairs import bert_encoder, bert_reference, write_jsonl

COLOURS = ["red", "blue", "green", "yellow"]
ANIMALS = ["cat", "dog", "horse", "mouse", "bird", "fish"]
TINY = ["--device", "cpu", "--precision", "fp32"]
# a fresh run twice as long each try; every correct run reaches the criterion well before the
# cap, which fails loudly
STEPS = (60, 120, 240)


def questions(rng: random.Random, n: int) -> list[dict]:
    """Which one is a colour? 2–4 choices, one colour and the rest animals."""
    rows = []
    for _ in range(n):
        k = rng.randint(2, 4)
        answer = rng.randrange(k)
        choices = rng.sample(ANIMALS, k)
        choices[answer] = rng.choice(COLOURS)
        rows.append({"context": "which one is a colour ?", "choices": choices,
                     "answer": answer})
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the run, its training file, a held-out file, the vocabulary's HF tokenizer)."""
    root = tmp_path_factory.mktemp("choice")
    init = bert_encoder(root / "bert")
    rng = random.Random(0)
    train = write_jsonl(root / "train.jsonl", questions(rng, 60))
    held_out = write_jsonl(root / "test.jsonl", questions(rng, 30))
    for steps in STEPS:
        run = root / f"run{steps}"
        r = cli_captured("train", "choice", "--data", train, "--model", init, "--out", run,
                         "--steps", steps, "--lr", "1e-3", "--batch", "8", "--max-len", "16",
                         "--eval-every", "50", "--no-progress", *TINY)
        assert r.code == 0, r.err
        accuracy = float(r.out.split("training questions: accuracy ")[1].split()[0])
        if accuracy >= 0.9:
            return run, train, held_out, bert_reference(root / "bert")
    pytest.fail(f"train choice: training accuracy 0.9 not reached in {STEPS[-1]} steps (the "
                f"cap); last:\n{r.out}")


def transformers_decisions(run, tok, path) -> list[int]:
    """Each question's best choice by transformers' BertForMultipleChoice on the run's weights,
    one question at a time."""
    folder = attnlab.save_pretrained(attnlab.load(run).model, run / "hf")
    model = transformers.BertForMultipleChoice.from_pretrained(folder).eval()
    chosen = []
    for line in path.read_text().splitlines():
        q = json.loads(line)
        enc = tok([q["context"]] * len(q["choices"]), q["choices"], truncation="longest_first",
                  max_length=16, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**{k: v[None] for k, v in enc.items()}).logits[0]
        chosen.append(int(logits.argmax()))
    return chosen


@pytest.mark.parametrize("split", ["train", "held out"])
def test_evaluate_choice_accuracy_equals_transformers(capsys, trained, split):
    run, train, held_out, tok = trained
    data = train if split == "train" else held_out
    answers = [json.loads(line)["answer"] for line in data.read_text().splitlines()]
    expected = transformers_decisions(run, tok, data)
    accuracy = sum(c == a for c, a in zip(expected, answers, strict=True)) / len(answers)
    r = cli(capsys, "evaluate", "choice", "--model", run, "--data", data, "--batch", "4",
            "--json", *TINY)
    assert r.code == 0, r.err
    got = json.loads(r.out)
    assert got["decisions"] == expected
    assert got["acc"] == pytest.approx(accuracy, abs=1e-12)
    assert got["examples"] == len(answers)
    if split == "train":
        assert accuracy >= 0.9  # the criterion, recomputed by transformers
    r = cli(capsys, "evaluate", "choice", "--model", run, "--data", data, *TINY)
    assert r.out.startswith(f"acc {accuracy:.4f} ± ")


def test_questions_with_fewer_choices_keep_their_logits_in_a_batch(trained):
    run, train, _, _ = trained
    enc = load_encoder(run)
    examples = read_examples(train)[:12]
    assert len({len(e.choices) for e in examples}) == 3  # 2, 3 and 4 choices share batches
    together = score_questions(enc.model, enc.tokenizer, examples, 16, batch_size=6)
    alone = [score_questions(enc.model, enc.tokenizer, [e], 16)[0] for e in examples]
    assert [len(s) for s in together] == [len(e.choices) for e in examples]
    for a, b in zip(together, alone, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_the_loss_is_over_the_choices_a_question_has(trained):
    """A question of 2 choices batched with ones of 4: its filled-up places take no
    probability, so the loss is each question's cross-entropy over its own choices."""
    run, train, _, _ = trained
    enc = load_encoder(run)
    examples = [e for e in read_examples(train) if len(e.choices) in (2, 4)][:4]
    assert {len(e.choices) for e in examples} == {2, 4}
    batch = collate_questions(question_rows(examples, enc.tokenizer, 16), enc.tokenizer.pad_id)
    with torch.no_grad():
        sums = Choose().loss(enc.model, batch)
    alone = score_questions(enc.model, enc.tokenizer, examples, 16)
    expected = sum(float(torch.nn.functional.cross_entropy(torch.tensor([s]),
                                                           torch.tensor([e.answer])))
                   for s, e in zip(alone, examples, strict=True))
    assert sums.tokens == 4
    assert float(sums.loss) == pytest.approx(expected, abs=1e-4)


def test_bad_input_is_one_line(capsys, tmp_path, trained):
    run, train, _, _ = trained
    assert_bad_input(cli(capsys, "evaluate", "choice", "--model", run, "--data", train,
                         "--shots", "2", *TINY), "--shots")
    assert_bad_input(cli(capsys, "evaluate", "choice", "--model", run, "--data", train,
                         "--int4", *TINY), "--int4")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"context": "x", "choices": ["a"], "answer": 0}])
    assert_bad_input(cli(capsys, "train", "choice", "--data", bad, "--model", run, "--out",
                         tmp_path / "r", *TINY), f"{bad}:1", "at least 2")
    assert_bad_input(cli(capsys, "train", "choice", "--data", train, "--model", run, "--out",
                         tmp_path / "r", "--truncation", "only_first", *TINY), "--truncation")
