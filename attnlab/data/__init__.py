"""attnlab.data: corpora, the synthetic numbers task, length filtering and token batching."""

from attnlab.data.batching import TranslationBatches, make_batches, pad
from attnlab.data.lm import LMBatches, eval_windows
from attnlab.data.numbers import english, german, numbers_corpus
from attnlab.data.parallel import FilterReport, filter_by_length, read_lines, read_parallel

__all__ = ["LMBatches", "eval_windows", "TranslationBatches", "make_batches", "pad", "english",
           "german", "numbers_corpus", "FilterReport", "filter_by_length", "read_lines",
           "read_parallel"]
