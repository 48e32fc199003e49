"""Pairs of texts in ``train classify`` (``pair_field``): the rows the recipe trains on are the
family's pair format, ``[CLS] A [SEP] B [SEP]`` with token types 0/1 (BERT's WordPiece) and
``<s> A </s></s> B </s>`` (RoBERTa), cut ``longest_first`` or ``only_second`` to the longest
input: equal to transformers' BertTokenizerFast / RobertaTokenizerFast pair encoding with
``truncation=...`` and ``max_length``, built from the same vocabulary files."""

import random

import pytest

from attnlab.errors import BadInput
from attnlab.tasks.classify import read_labelled, split_by_hash
from attnlab.tasks.classify.recipe import ClassifyRecipe
from attnlab.training.schedule import LinearSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig
from tests.tasks.pairs import (
    WORDS,
    bert_encoder,
    bert_reference,
    roberta_encoder,
    roberta_reference,
    write_jsonl,
)

MAX_LEN = 16
PLAIN = [w for w in WORDS if not w.startswith("##")]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """family -> (the encoder to start from, transformers' tokenizer of it)."""
    root = tmp_path_factory.mktemp("pairs")
    return {"bert": (bert_encoder(root / "bert"), bert_reference(root / "bert")),
            "roberta": (roberta_encoder(root / "roberta"), roberta_reference(root / "roberta"))}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Premises of 2–4 words, hypotheses of 2–20: many pairs are longer than MAX_LEN, some
    by their first text's share, most by the second's."""
    rng = random.Random(0)
    rows = [{"id": f"p{i}", "premise": " ".join(rng.choices(PLAIN, k=rng.randint(2, 4))),
             "hypothesis": " ".join(rng.choices(PLAIN, k=rng.randint(2, 20))),
             "label": rng.choice(["yes", "no"])} for i in range(80)]
    return write_jsonl(tmp_path_factory.mktemp("data") / "pairs.jsonl", rows)


def train_config() -> TrainConfig:
    return TrainConfig(steps=1, label_smoothing=0.0, optimizer="adamw", progress=False,
                       schedule=schedule_to_dict(LinearSchedule(1e-3, 0, 1)))


def prepared_rows(data, init, truncation: str) -> list[tuple[list[int], list[int], int]]:
    recipe = ClassifyRecipe(data, "premise", "label", str(init), MAX_LEN, 8,
                            pair_field="hypothesis", truncation=truncation)
    prepared = recipe.prepare(None, train_config())
    assert prepared.config.extra["reading"] == {"pair_field": "hypothesis",
                                                "truncation": truncation}
    return prepared.batches.rows


@pytest.mark.parametrize("truncation", ["longest_first", "only_second"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_training_rows_equal_transformers_pair_encoding(families, data, family, truncation):
    init, reference = families[family]
    rows = prepared_rows(data, init, truncation)
    train = split_by_hash(read_labelled(data, "premise", "label", pair_field="hypothesis"))[0]
    assert len(rows) == len(train) > 50
    cut = 0
    for (ids, types, label), e in zip(rows, train, strict=True):
        expected = reference(e.text, e.pair, truncation=truncation, max_length=MAX_LEN,
                             return_token_type_ids=True)
        assert ids == expected["input_ids"], (e.text, e.pair)
        assert types == expected["token_type_ids"]
        assert label == ["no", "yes"].index(e.label)
        whole = reference(e.text, e.pair)["input_ids"]
        cut += len(whole) > MAX_LEN
        if family == "bert":  # [CLS] A [SEP] B [SEP]: types 0 through the first [SEP], then 1
            first_sep = ids.index(reference.sep_token_id)
            assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
            assert ids[0] == reference.cls_token_id and ids[-1] == reference.sep_token_id
        else:  # <s> A </s></s> B </s>, no token types
            assert set(types) == {0}
            assert ids[0] == reference.bos_token_id and ids[-1] == reference.eos_token_id
            assert [reference.eos_token_id] * 2 in [ids[i : i + 2] for i in range(len(ids))]
    assert cut >= 10  # the cutting was tested, not only the framing


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_only_second_that_cannot_fit_is_one_error_as_transformers_refuses(tmp_path, families,
                                                                         family):
    init, reference = families[family]
    long_first = " ".join(PLAIN[:MAX_LEN])  # alone more than the input holds
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"id": str(i), "premise": long_first, "hypothesis": "the dog", "label": str(i % 2)}
        for i in range(20)])
    with pytest.raises(Exception):  # noqa: B017  (the tokenizers library's own error)
        reference(long_first, "the dog", truncation="only_second", max_length=MAX_LEN)
    with pytest.raises(BadInput, match="only_second"):
        prepared_rows(data, init, "only_second")
    assert prepared_rows(data, init, "longest_first")  # longest_first cuts the first instead


def test_options_that_do_not_go_together_are_named(families, data):
    init = str(families["bert"][0])
    for kw, named in ((dict(pair_field="hypothesis", pool="max"), "--pair-field"),
                      (dict(truncation="only_first"), "only_first"),
                      (dict(pool="median"), "median"), (dict(stride=4), "--stride")):
        with pytest.raises(BadInput, match=named):
            ClassifyRecipe(data, "premise", "label", init, MAX_LEN, 8,
                           **kw).prepare(None, train_config())
