"""Extractive question answering (SQuAD; Devlin et al., 2019, section 4.2): the answer is a
span of the context, read from two logits per token.

    input     [CLS] question [SEP] context window [SEP]        token types 0 … 0 1 … 1
    logits    s = h·w_s,  e = h·w_e                           (batch, seq) each: BERT's qa head
    answer    argmax over i ≤ j < i + L of s_i + e_j, over context tokens of every window

* :mod:`~attnlab.tasks.qa.data`: SQuAD files, a question's overlapping windows of its
  context, the training rows (the answer's first and last token);
* :mod:`~attnlab.tasks.qa.recipe`: ``train qa`` (:class:`QARecipe`);
* :mod:`~attnlab.tasks.qa.predict`: the best span across windows (``attnlab qa``), and
  SQuAD's exact match and F1 (``evaluate qa``).
"""

from attnlab.tasks.qa.data import Question, Window, check_window, read_squad, windows
from attnlab.tasks.qa.predict import (
    answer,
    answer_many,
    best_span,
    normalize_answer,
    reading_window,
    score_questions,
    squad_scores,
)

__all__ = ["Question", "read_squad", "Window", "windows", "check_window", "reading_window",
           "best_span", "answer", "answer_many", "normalize_answer", "squad_scores",
           "score_questions"]
