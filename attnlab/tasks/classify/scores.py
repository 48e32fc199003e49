"""A classifier's scores: accuracy, each class's precision, recall and F1, their macro, micro
and weighted means, and the confusion matrix, from gold and predicted class indices.

    confusion[t][p]   examples of true class t predicted as p
    precision_c = C[c][c] / Σ_t C[t][c]      recall_c = C[c][c] / Σ_p C[c][p]
    F1_c = 2·P·R / (P + R)                    (0 where a denominator is 0)
    macro = the plain mean over classes; weighted = weighted by support (true examples);
    micro = from the summed counts, which is the accuracy when each example has one label

Every class of the model counts, also one with no example and no prediction (its P, R and
F1 are 0): the numbers are scikit-learn's ``classification_report(labels=all classes)`` and
``confusion_matrix``, and the macro-F1 equals the one training reports
(:func:`attnlab.training.objectives.classification_metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnlab.errors import BadInput


@dataclass(frozen=True)
class Scores:
    """Precision, recall and F1 of one class, or a mean of them; ``support``: the true
    examples they are over."""

    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True)
class Report:
    labels: tuple[str, ...]
    confusion: tuple[tuple[int, ...], ...]  # [true class][predicted class]
    per_class: tuple[Scores, ...]  # in the order of ``labels``
    accuracy: float
    macro: Scores
    micro: Scores
    weighted: Scores

    @property
    def total(self) -> int:
        return sum(map(sum, self.confusion))


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _f1(precision: float, recall: float) -> float:
    return _ratio(2 * precision * recall, precision + recall)


def classification_report(gold: Sequence[int], predicted: Sequence[int],
                          labels: Sequence[str]) -> Report:
    """The report of ``predicted`` against ``gold`` (class indices into ``labels``)."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} examples")
    if not gold:
        raise BadInput("no examples to score")
    n = len(labels)
    confusion = [[0] * n for _ in range(n)]
    for t, p in zip(gold, predicted, strict=True):
        if not (0 <= t < n and 0 <= p < n):
            raise ValueError(f"class index {t} or {p} is not one of the {n} classes")
        confusion[t][p] += 1
    per_class = []
    for c in range(n):
        hit = confusion[c][c]
        support = sum(confusion[c])
        precision = _ratio(hit, sum(row[c] for row in confusion))
        recall = _ratio(hit, support)
        per_class.append(Scores(precision, recall, _f1(precision, recall), support))
    total = len(gold)
    correct = sum(confusion[c][c] for c in range(n))
    accuracy = correct / total

    def mean(weights: list[float]) -> Scores:
        w = sum(weights)
        return Scores(*(sum(x * getattr(s, f) for x, s in zip(weights, per_class, strict=True))
                        / w for f in ("precision", "recall", "f1")), total)

    # one label an example: every false positive is another class's false negative, so the
    # summed precision and recall are both correct / total
    return Report(tuple(labels), tuple(map(tuple, confusion)), tuple(per_class), accuracy,
                  mean([1.0] * n), Scores(accuracy, accuracy, accuracy, total),
                  mean([float(s.support) for s in per_class]))


def format_report(report: Report, confusion: bool = True) -> list[str]:
    """The report as printed lines: accuracy, the three means, the per-class table, and (with
    ``confusion``) the confusion matrix with the class names."""
    width = max(len("weighted"), *map(len, report.labels))
    correct = sum(report.confusion[c][c] for c in range(len(report.labels)))
    lines = [f"accuracy {report.accuracy:.4f} ({correct:,} of {report.total:,})",
             f"{'':<{width}}  precision  recall      F1  support"]
    rows = [*zip(report.labels, report.per_class, strict=True), ("", None),
            ("macro", report.macro), ("micro", report.micro), ("weighted", report.weighted)]
    for name, s in rows:
        lines.append("" if s is None else f"{name:<{width}}  {s.precision:9.4f}  "
                     f"{s.recall:6.4f}  {s.f1:6.4f}  {s.support:7,}")
    if confusion:
        lines += ["", "confusion matrix (a row per true label, a column per predicted label):"]
        cell = max(len(f"{report.total:,}"), *map(len, report.labels))
        lines.append(f"{'':<{width}}  " + " ".join(f"{name:>{cell}}" for name in report.labels))
        for name, row in zip(report.labels, report.confusion, strict=True):
            lines.append(f"{name:<{width}}  " + " ".join(f"{k:>{cell},}" for k in row))
    return lines


__all__ = ["Scores", "Report", "classification_report", "format_report"]
