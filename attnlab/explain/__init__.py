"""attnlab.explain: one sentence (or, with a ViT, one image) through the pipeline, recomputed
and checked stage by stage; attention rollout; a numpy reference for one attention head
(forward and backward); an HTML report; the course's worked examples, recomputed."""

from attnlab.explain.examples import (
    Example,
    ExampleResult,
    format_example,
    list_examples,
    run_example,
)
from attnlab.explain.hooks import patched, stage_names, trace
from attnlab.explain.image import (
    ImageSubject,
    attention_rollout,
    image_attention,
    make_image_subject,
    walk_image,
)
from attnlab.explain.numpy_attention import head_backward, head_forward
from attnlab.explain.subject import Subject, load_subject_model, make_subject
from attnlab.explain.walkthrough import Check, Stage, Walkthrough, compare_word, walk

__all__ = ["walk", "compare_word", "Walkthrough", "Stage", "Check", "Subject", "make_subject",
           "load_subject_model", "head_forward", "head_backward", "walk_image",
           "make_image_subject", "ImageSubject", "attention_rollout", "image_attention"]
__all__ += ["list_examples", "run_example", "format_example", "Example", "ExampleResult"]
__all__ += ["trace", "patched", "stage_names"]  # hooks: record and replace any stage
