"""Sequence classification: a [CLS] classifier fine-tuned from a pretrained encoder on
labelled JSON lines.

* :mod:`~attnlab.tasks.classify.data`: the JSON-lines reader, the fixed hash split (80/10/10)
  and the ``[CLS] text [SEP]`` rows;
* :mod:`~attnlab.tasks.classify.recipe`: ``train classify`` (:class:`ClassifyRecipe`), whose
  results are accuracy and macro-F1 on the validation and test splits;
* :mod:`~attnlab.tasks.classify.predict`: class probabilities for texts (``attnlab classify``).
"""

from attnlab.tasks.classify.data import (
    Example,
    encode_examples,
    hash_fraction,
    read_labelled,
    split_by_hash,
)
from attnlab.tasks.classify.predict import classify_texts

__all__ = ["Example", "read_labelled", "hash_fraction", "split_by_hash", "encode_examples",
           "classify_texts"]
