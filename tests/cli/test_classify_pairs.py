"""``attnlab train classify --pair-field`` and ``attnlab classify --pair A B``: what classify
prints for pairs equals transformers' BertForSequenceClassification on the same weights, fed
by BertTokenizerFast's pair encoding (cut as ``--truncation`` says); bad options are one line
and exit code 2."""

import random

import pytest
import torch
import transformers

import attnlab
from tests.cli.helpers import assert_bad_input, cli, cli_captured
from tests.tasks.pairs import WORDS, bert_encoder, bert_reference, write_jsonl

PLAIN = [w for w in WORDS if not w.startswith("##")]
TINY = ["--device", "cpu", "--precision", "fp32"]


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    """(a 2-step pair classifier's run, the data, transformers' tokenizer of its vocabulary)."""
    root = tmp_path_factory.mktemp("pair_cli")
    init = bert_encoder(root / "bert")
    rng = random.Random(0)
    data = write_jsonl(root / "pairs.jsonl", [
        {"id": str(i), "premise": " ".join(rng.choices(PLAIN, k=4)),
         "hypothesis": " ".join(rng.choices(PLAIN, k=6)), "label": rng.choice(["yes", "no"])}
        for i in range(40)])
    r = cli_captured("train", "classify", "--data", data, "--text-field", "premise",
                     "--pair-field", "hypothesis", "--label-field", "label", "--init", init,
                     "--out", root / "run", "--steps", "2", "--batch", "8", "--max-len", "24",
                     "--eval-every", "2", "--no-progress", *TINY)
    assert r.code == 0, r.err
    assert "pairs cut longest_first to 24 tokens" in r.out
    return root / "run", data, bert_reference(root / "bert")


def transformers_probs(run, tok, pairs, truncation):
    """Class probabilities from transformers' own classifier and tokenizer."""
    folder = attnlab.save_pretrained(attnlab.load(run).model, run.parent / "hf")
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], truncation=truncation,
              max_length=model.config.max_position_embeddings, padding=True,
              return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.softmax(-1)


@pytest.mark.parametrize("truncation", ["longest_first", "only_second"])
def test_classify_pair_equals_transformers(capsys, pair_run, truncation):
    run, _, tok = pair_run
    rng = random.Random(1)
    pairs = [("a man is eating food", "the man is eating bread"),
             ("the dog", "the cat was sleeping on the sofa"),
             # longer than the model's 64 positions: cut as transformers cuts it
             (" ".join(rng.choices(PLAIN, k=20)), " ".join(rng.choices(PLAIN, k=60)))]
    assert len(tok(*pairs[2])["input_ids"]) > 64
    r = cli(capsys, "classify", "--model", run, "--truncation", truncation, *TINY,
            *[x for pair in pairs for x in ("--pair", *pair)])
    assert r.code == 0, r.err
    lines = [line.split("\t") for line in r.out.splitlines()]
    probs = transformers_probs(run, tok, pairs, truncation)
    labels = attnlab.load(run).config.extra["labels"]
    assert [[a[:80], b[:80]] for a, b in pairs] == [line[2:] for line in lines]
    for line, p in zip(lines, probs, strict=True):
        assert line[0] == labels[int(p.argmax())]
        assert abs(float(line[1]) - float(p.max())) <= 6e-5, (line, p)


def test_bad_options_are_one_line(capsys, tmp_path, pair_run):
    run, data, _ = pair_run
    train = ["train", "classify", "--data", data, "--text-field", "premise", "--label-field",
             "label", "--out", tmp_path / "r", "--init", run, *TINY]
    assert_bad_input(cli(capsys, *train, "--pair-field", "hypothesys"), "'hypothesys'",
                     str(data))
    assert_bad_input(cli(capsys, *train, "--pool", "median"), "--pool", "median")
    assert_bad_input(cli(capsys, *train, "--truncation", "only_first"), "--truncation")
    assert_bad_input(cli(capsys, *train, "--pool", "max", "--pair-field", "hypothesis"),
                     "--pool", "--pair-field")
    assert_bad_input(cli(capsys, "classify", "--model", run, *TINY, "a text without its pair"),
                     "pairs", "--pair-field hypothesis", while_running=True)
    assert_bad_input(cli(capsys, "classify", "--model", run, *TINY, "--pair", "a", "b", "c"),
                     "--pair")
    assert_bad_input(cli(capsys, "classify", "--model", run, *TINY, "--pool", "mode", "x"),
                     "--pool")
