"""Sequence classification: a [CLS] classifier fine-tuned from a pretrained encoder on
labelled JSON lines.

* :mod:`~attnlab.tasks.classify.data`: the JSON-lines reader, the fixed hash split (80/10/10),
  the ``[CLS] text [SEP]`` rows and the pairs' rows in the family's pair format;
* :mod:`~attnlab.tasks.classify.windows`: documents longer than the input read in overlapping
  windows, their logits pooled (max or mean);
* :mod:`~attnlab.tasks.classify.recipe`: ``train classify`` (:class:`ClassifyRecipe`), whose
  results are accuracy and macro-F1 on the validation and test splits, and which prints the
  test split's report;
* :mod:`~attnlab.tasks.classify.predict`: class probabilities for texts, pairs and long
  documents (``attnlab classify``);
* :mod:`~attnlab.tasks.classify.scores`: the report (``evaluate classify``): accuracy, per-class
  and macro, micro and weighted precision, recall and F1, the confusion matrix.
"""

from attnlab.tasks.classify.data import (
    TRUNCATIONS,
    Example,
    encode_examples,
    encode_pairs,
    hash_fraction,
    read_labelled,
    split_by_hash,
)
from attnlab.tasks.classify.predict import classify_examples, classify_texts, decisions
from attnlab.tasks.classify.scores import Report, Scores, classification_report, format_report

__all__ = ["Example", "read_labelled", "hash_fraction", "split_by_hash", "encode_examples",
           "encode_pairs", "TRUNCATIONS", "classify_texts", "classify_examples", "decisions",
           "Report", "Scores", "classification_report", "format_report"]
