"""The classification report (attnlab.tasks.classify.scores) against scikit-learn, and by
hand."""

import random

import pytest
from sklearn.metrics import classification_report as sk_report
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from attnlab.errors import BadInput
from attnlab.tasks.classify import classification_report, format_report


def test_a_report_by_hand():
    # gold a a a b b c, predicted a a b b c c
    r = classification_report([0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 2, 2], ["a", "b", "c"])
    assert r.confusion == ((2, 1, 0), (0, 1, 1), (0, 0, 1))
    assert r.accuracy == pytest.approx(4 / 6)
    a, b, c = r.per_class
    assert (a.precision, a.recall, a.f1, a.support) == (1.0, pytest.approx(2 / 3), 0.8, 3)
    assert (b.precision, b.recall, b.f1, b.support) == (0.5, 0.5, 0.5, 2)
    assert (c.precision, c.recall, c.f1, c.support) == (0.5, 1.0, pytest.approx(2 / 3), 1)
    assert r.macro.f1 == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert r.weighted.f1 == pytest.approx((3 * 0.8 + 2 * 0.5 + 2 / 3) / 6)
    assert (r.micro.precision, r.micro.recall, r.micro.f1) == (pytest.approx(4 / 6),) * 3
    assert format_report(r) == [
        "accuracy 0.6667 (4 of 6)",
        "          precision  recall      F1  support",
        "a            1.0000  0.6667  0.8000        3",
        "b            0.5000  0.5000  0.5000        2",
        "c            0.5000  1.0000  0.6667        1",
        "",
        "macro        0.6667  0.7222  0.6556        6",  # (1 + .5 + .5) / 3, ...
        "micro        0.6667  0.6667  0.6667        6",
        "weighted     0.7500  0.6667  0.6778        6",  # (3·1 + 2·.5 + 1·.5) / 6, ...
        "",
        "confusion matrix (a row per true label, a column per predicted label):",
        "          a b c",
        "a         2 1 0",
        "b         0 1 1",
        "c         0 0 1"]


@pytest.mark.parametrize("seed", range(5))
def test_equals_sklearn_with_absent_and_never_predicted_classes(seed):
    """Five classes: 'd' is never true, 'e' neither true nor predicted; sklearn is given every
    class, as attnlab counts them."""
    rng = random.Random(seed)
    labels = ["a", "b", "c", "d", "e"]
    gold = [rng.choice([0, 0, 0, 1, 2]) for _ in range(200)]
    predicted = [g if rng.random() < 0.6 else rng.choice([0, 1, 2, 3]) for g in gold]
    got = classification_report(gold, predicted, labels)
    everything = list(range(5))
    ref = sk_report(gold, predicted, labels=everything, target_names=labels, output_dict=True,
                    zero_division=0)
    for name, s in zip(labels, got.per_class, strict=True):
        assert (s.precision, s.recall, s.f1, s.support) == pytest.approx(
            (ref[name]["precision"], ref[name]["recall"], ref[name]["f1-score"],
             ref[name]["support"]), abs=1e-12)
    for mean, key in ((got.macro, "macro avg"), (got.weighted, "weighted avg")):
        assert (mean.precision, mean.recall, mean.f1, mean.support) == pytest.approx(
            (ref[key]["precision"], ref[key]["recall"], ref[key]["f1-score"],
             ref[key]["support"]), abs=1e-12)
    micro = precision_recall_fscore_support(gold, predicted, labels=everything, average="micro")
    assert (got.micro.precision, got.micro.recall, got.micro.f1) == pytest.approx(micro[:3],
                                                                                  abs=1e-12)
    assert got.accuracy == pytest.approx(ref["accuracy"], abs=1e-12)
    assert [list(row) for row in got.confusion] == confusion_matrix(
        gold, predicted, labels=everything).tolist()


def test_nothing_to_score_is_bad_input():
    with pytest.raises(BadInput, match="no examples"):
        classification_report([], [], ["a", "b"])
