"""``attnlab train ner``, ``attnlab ner`` and ``attnlab evaluate ner`` on synthetic CoNLL files
whose entities are names from fixed lists: a tiny encoder learns them to a stated F1, the
three commands agree, and bad files are one line each."""

import json
import random
import re

import pytest

from attnlab.sentence_encoder import load_encoder
from attnlab.tasks.ner import predict_tags
from tests.cli.helpers import assert_bad_input, cli, cli_captured, tiny_bert

PEOPLE = ["Anna", "Boris", "Clara", "Dmitri", "Elena"]
PLACES = ["Paris", "Berlin", "Lagos", "Quito", "Oslo"]
FILLER = ["went", "to", "see", "the", "market", "with", "a", "friend", "in", "today"]


def sentence(rng: random.Random) -> list[tuple[str, str]]:
    words = [(w, "O") for w in rng.choices(FILLER, k=rng.randint(3, 6))]
    person = [(rng.choice(PEOPLE), "B-PER")]
    if rng.random() < 0.5:
        person.append((rng.choice(PEOPLE) + "son", "I-PER"))
    at = rng.randrange(len(words) + 1)
    words[at:at] = person
    words.insert(rng.randrange(len(words) + 1), (rng.choice(PLACES), "B-LOC"))
    return words


def write_conll(path, sentences) -> None:
    path.write_text("-DOCSTART- -X- O\n\n" + "\n\n".join(
        "\n".join(f"{w} NNP {t}" for w, t in s) for s in sentences) + "\n")


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ner")
    rng = random.Random(0)
    data = folder / "data"
    data.mkdir()
    for split, n in (("train", 300), ("dev", 40), ("test", 60)):
        write_conll(data / f"{split}.txt", [sentence(rng) for _ in range(n)])
    (folder / "corpus.txt").write_text(" ".join(PEOPLE + PLACES + FILLER) + " son\n")
    tiny_bert(folder / "corpus.txt", folder / "encoder", vocab_size=100, max_len=32)
    # Trained to a stated criterion, test F1 at least 0.95, never to a fixed count: the float
    # trajectory differs between CPUs (150 steps gave F1 1.00 on one and 0.976 on another,
    # where one two-word person was read as two). Each try is a fresh run twice as long; the
    # cap fails loudly.
    last = ""
    for steps in (150, 300, 600):
        run = folder / f"run{steps}"
        r = cli_captured("train", "ner", "--data", data, "--model", folder / "encoder", "--out",
                         run, "--steps", str(steps), "--lr", "3e-3", "--batch", "16",
                         "--eval-every", "50", "--warmup-ratio", "0.1", "--no-progress",
                         "--device", "cpu", "--precision", "fp32")
        assert r.code == 0, r.err
        last = re.search(r"test: .*", r.out)[0]
        if f1_of(r.out) >= 0.95:
            return run, data, r.out
    pytest.fail(f"train ner: test F1 0.95 not reached in 600 steps (the cap); last: {last}")


def f1_of(out: str) -> float:
    """The test F1 that `train ner` prints."""
    return float(re.search(r"test: entity precision \S+, recall \S+, F1 (\S+)", out)[1])


def test_train_ner_learns_the_entities(ner_run):
    _, _, out = ner_run
    assert f1_of(out) >= 0.95, out
    assert "dev: entity precision" in out and "model in " in out


def test_evaluate_ner_gives_the_runs_test_score(capsys, ner_run):
    """The same weights, test file and precision as the run's own test pass (fp32): the same
    scores. (In ``auto``, bf16 where it is native, a near tie may tag a word otherwise: a
    clean clone scored F1 0.9879 against the run's 1.0000.)"""
    run, data, out = ner_run
    expected = re.search(r"test: entity precision (\S+), recall (\S+), F1 (\S+)", out)
    r = cli(capsys, "evaluate", "ner", "--model", run, "--data", data / "test.txt", "--quiet",
            "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert (f"entity precision {expected[1]}, recall {expected[2]}, F1 {expected[3]}"
            in r.out)
    assert re.search(r"PER +precision", r.out) and re.search(r"LOC +precision", r.out)


def test_ner_prints_the_entities_of_a_text(capsys, ner_run):
    # A test sentence with a two-word person that the run tags right (the criterion leaves a
    # few wrong, never most): `ner` must print the file's own entities, at the characters the
    # words are at, the two-word person as one.
    run, data, _ = ner_run
    enc = load_encoder(run)
    gold = [[line.split() for line in b.splitlines()]
            for b in (data / "test.txt").read_text().split("\n\n")[1:]]
    tagged = predict_tags(enc.model, enc.tokenizer, [[w for w, _, _ in s] for s in gold])
    words = next((s for s, tags in zip(gold, tagged, strict=True)
                  if "I-PER" in tags and tags == [tag for _, _, tag in s]), None)
    if words is None:
        pytest.fail("no test sentence with a two-word person is tagged right")
    text = " ".join(w for w, _, _ in words)
    expected, at = [], 0
    for word, _, tag in words:
        if tag.startswith("I-"):
            kind, start, _ = expected[-1]
            expected[-1] = (kind, start, at + len(word))
        elif tag.startswith("B-"):
            expected.append((tag[2:], at, at + len(word)))
        at += len(word) + 1
    r = cli(capsys, "ner", "--model", run, "--json", text, "--quiet")
    assert r.code == 0, r.err
    found = json.loads(r.out)["entities"]
    assert [(e["type"], e["start"], e["end"]) for e in found] == expected
    assert all(text[e["start"]:e["end"]] == e["text"] for e in found)
    assert any(" " in e["text"] for e in found)  # the two-word person is one entity
    bracketed, at = "", 0
    for kind, a, b in expected:
        bracketed += f"{text[at:a]}[{kind} {text[a:b]}]"
        at = b
    r = cli(capsys, "ner", "--model", run, text, "--quiet")
    assert r.out.strip() == bracketed + text[at:]


@pytest.mark.parametrize("line, says", [
    ("Oslo NNP", ":3: expected 3 columns"),
    ("Oslo NNP S-LOC", ":3: tag 'S-LOC' is not in the BIO scheme"),
])
def test_bad_conll_files_are_one_line(capsys, tmp_path, line, says):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("Anna NNP B-PER\nwent VBD O\n" + line + "\n")
    r = cli(capsys, "train", "ner", "--data", data, "--model", "minilm", "--out",
            tmp_path / "run", "--no-progress")
    assert_bad_input(r, str(data / "train.txt") + says)


def test_a_model_without_a_tagging_head_is_refused(capsys, mlm_run):
    r = cli(capsys, "ner", "--model", mlm_run.path, "Anna went to Oslo")
    assert_bad_input(r, "head='mlm'", "'tokens'")
