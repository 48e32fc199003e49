"""attnlab.explain: one sentence through the pipeline, recomputed and checked stage by stage;
a numpy reference for one attention head (forward and backward); an HTML report."""

from attnlab.explain.numpy_attention import head_backward, head_forward
from attnlab.explain.subject import Subject, load_subject_model, make_subject
from attnlab.explain.walkthrough import Check, Stage, Walkthrough, compare_word, walk

__all__ = ["walk", "compare_word", "Walkthrough", "Stage", "Check", "Subject", "make_subject",
           "load_subject_model", "head_forward", "head_backward"]
