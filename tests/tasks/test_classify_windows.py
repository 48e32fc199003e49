"""Long documents in ``train classify`` / ``classify`` (``--pool max|mean``): the windows are
the document's tokens cut by hand (and transformers' overflowing windows), a document's
probabilities are the softmax of its windows' logits pooled by hand, each window run alone,
the training loss is the cross-entropy of those pooled logits, and training with windows
learns a label that only the later windows see."""

import dataclasses
import json
import random

import pytest
import torch
import torch.nn.functional as F

from attnlab import BERT
from attnlab.sentence_encoder import load_encoder
from attnlab.storage import load, save_model_dir
from attnlab.tasks.classify import Example, classify_examples
from attnlab.tasks.classify.recipe import PooledClassify, train_classify
from attnlab.tasks.classify.windows import collate_windows, encode_windows, text_windows
from attnlab.training.schedule import LinearSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig
from tests.tasks.pairs import WORDS, bert_encoder, bert_reference, write_jsonl

PLAIN = [w for w in WORDS if not w.startswith("##")]


def by_hand(tok, text: str, max_len: int, stride: int) -> list[list[int]]:
    """[CLS] + tokens[k·step : k·step + room] + [SEP] from k = 0 until one reaches the end."""
    tokens, room = tok.encode(text), max_len - 2
    windows, start = [], 0
    while True:
        windows.append([tok.cls_id, *tokens[start : start + room], tok.sep_id])
        if start + room >= len(tokens):
            return windows
        start += room - stride


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A random bert-tiny classifier of 3 classes (an attnlab folder) that reads windows of 12
    tokens, and its vocabulary's transformers tokenizer."""
    root = tmp_path_factory.mktemp("windows")
    folder = bert_encoder(root / "bert", head="classify")
    loaded = load(folder)
    config = dataclasses.replace(loaded.config, num_labels=3,
                                 extra={"labels": ["a", "b", "c"],
                                        "reading": {"pool": "max", "max_len": 12, "stride": 5}})
    torch.manual_seed(1)
    save_model_dir(root / "clf", BERT(config), config, {"text": loaded.tokenizer.to_dict()})
    return root / "clf", bert_reference(root / "bert")


@pytest.mark.parametrize("max_len,stride", [(8, 0), (8, 2), (12, 4), (64, 10)])
def test_windows_are_the_tokens_cut_by_hand_and_as_transformers_cuts_them(classifier, max_len,
                                                                        stride):
    tok, reference = load_encoder(classifier[0]).tokenizer, classifier[1]
    rng = random.Random(max_len)
    for n in (0, 3, 6, 7, 25, 61):
        text = " ".join(rng.choices(PLAIN, k=n))
        got = text_windows(tok, text, max_len, stride)
        assert got == by_hand(tok, text, max_len, stride)
        theirs = reference(text, truncation=True, max_length=max_len, stride=stride,
                           return_overflowing_tokens=True)["input_ids"]
        assert got == theirs
        assert all(len(w) <= max_len for w in got)


@pytest.mark.parametrize("pool", ["max", "mean"])
def test_document_probabilities_are_the_windows_logits_pooled_by_hand(classifier, pool):
    enc = load_encoder(classifier[0])
    rng = random.Random(0)
    docs = [" ".join(rng.choices(PLAIN, k=n)) for n in (3, 40, 17, 90, 9)]
    got = classify_examples(enc, [Example(str(i), d, "") for i, d in enumerate(docs)],
                            batch_size=3, pool=pool, stride=3)
    expected = []
    with torch.no_grad():
        for d in docs:  # each window run alone, no padding, then pooled class by class
            logits = torch.cat([enc.model(torch.tensor([w]), torch.zeros(1, len(w), dtype=int),
                                          torch.ones(1, len(w), dtype=int))
                                for w in by_hand(enc.tokenizer, d, 12, 3)])
            pooled = logits.max(0).values if pool == "max" else logits.sum(0) / len(logits)
            expected.append(pooled.softmax(-1))
    # the run's windows of 12 tokens, the stride given: 1 to 13 windows a document
    assert [len(by_hand(enc.tokenizer, d, 12, 3)) for d in docs] == [1, 6, 2, 13, 1]
    torch.testing.assert_close(got, torch.stack(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pool", ["max", "mean"])
def test_training_loss_is_the_cross_entropy_of_the_pooled_logits(classifier, pool):
    enc = load_encoder(classifier[0])
    rng = random.Random(1)
    examples = [Example(str(i), " ".join(rng.choices(PLAIN, k=n)), "abc"[i % 3])
                for i, n in enumerate((30, 4, 12, 22))]
    rows = encode_windows(examples, enc.tokenizer, ["a", "b", "c"], 8, 2)
    batch = collate_windows(rows, enc.tokenizer.pad_id)
    assert batch.windows.tolist() == [len(w) for w, _ in rows] and sum(batch.windows) > 8
    with torch.no_grad():
        sums = PooledClassify(pool).loss(enc.model, batch)
        expected = 0.0
        for windows, label in rows:
            z = torch.stack([enc.model(torch.tensor([w]))[0] for w in windows])
            z = z.max(0).values if pool == "max" else z.mean(0)
            expected += float(F.cross_entropy(z[None], torch.tensor([label])))
    assert sums.tokens == 4
    assert float(sums.loss) == pytest.approx(expected, abs=1e-4)


def test_training_with_windows_reads_what_the_first_window_cannot(tmp_path):
    """The label's word sits past the first window (tokens 8–14 of a 15-token text, windows
    of 6 tokens): cut at --max-len the texts say nothing, read in windows they do. Criterion:
    test accuracy at least 0.9 (a fresh run twice as long each try, the cap fails loudly)."""
    init = bert_encoder(tmp_path / "bert")
    rng = random.Random(0)
    filler = ["the", "a", "man", "woman", "dog", "cat", "is", "was", "on", "in", "park",
              "sofa", "film", "and"]
    rows = []
    for i in range(240):
        label, words = rng.choice(["pos", "neg"]), rng.choices(filler, k=14)
        words.insert(rng.randint(8, 14), "great" if label == "pos" else "awful")
        rows.append({"id": str(i), "text": " ".join(words), "label": label})
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    first = [json.loads(line)["text"].split()[:6] for line in data.read_text().splitlines()]
    assert not any({"great", "awful"} & set(words) for words in first)  # one token a word
    for steps in (60, 120, 240):
        config = TrainConfig(steps=steps, label_smoothing=0.0, optimizer="adamw",
                             weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6, progress=False,
                             save_every=10_000, eval_every=30, patience=3, device="cpu",
                             precision="fp32",
                             schedule=schedule_to_dict(LinearSchedule(1e-3, steps // 10, steps)))
        results = train_classify(data, "text", "label", str(init), tmp_path / f"run{steps}",
                                 config, max_len=8, batch_size=16, log=lambda *a: None,
                                 pool="max", stride=2)
        if results["test_accuracy"] >= 0.9:
            break
    else:
        pytest.fail(f"windows: test accuracy 0.9 not reached in {steps} steps; {results}")
    reading = load(tmp_path / f"run{steps}").config.extra["reading"]
    assert reading == {"pool": "max", "max_len": 8, "stride": 2}
