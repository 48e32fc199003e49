"""attnlab.data: corpora, the synthetic numbers task, length filtering and token batching
(images for the ViT: :mod:`attnlab.data.images`)."""

from attnlab.data.batching import TranslationBatches, make_batches
from attnlab.data.corpora import (
    Corpus,
    FilterReport,
    filter_by_length,
    load_corpus,
    read_parallel,
)
from attnlab.data.lm import LMBatches, eval_windows
from attnlab.data.numbers import english, german, numbers_corpus
from attnlab.data.stream import (
    ImageBatch,
    LabelledBatch,
    LMBatch,
    MaskedLMBatch,
    TranslationBatch,
    to_device,
)
from attnlab.tokenizers import pad

__all__ = ["LMBatches", "eval_windows", "TranslationBatches", "make_batches", "pad", "english",
           "german", "numbers_corpus", "FilterReport", "filter_by_length",
           "read_parallel", "TranslationBatch", "LMBatch", "MaskedLMBatch", "LabelledBatch",
           "ImageBatch", "to_device", "Corpus", "load_corpus"]
