"""Multiple-choice questions (one JSON object a line: ``context``, ``choices``, ``answer``):

* :mod:`~attnlab.tasks.choice.data`: the reader;
* :mod:`~attnlab.tasks.choice.harness`: a language model's scores, zero- or few-shot, as
  EleutherAI's lm-evaluation-harness computes them (``evaluate choice`` on a language model);
* :mod:`~attnlab.tasks.choice.head`: an encoder with a multiple-choice head, each choice read
  with its context as a pair and given one logit (``evaluate choice`` on such an encoder);
* :mod:`~attnlab.tasks.choice.recipe`: ``train choice``, the head fine-tuned from a pretrained
  encoder.
"""

from attnlab.tasks.choice.data import Example, read_examples
from attnlab.tasks.choice.harness import (
    FEWSHOT_DELIMITER,
    TARGET_DELIMITER,
    DemoPool,
    Judged,
    argmax,
    build_prompt,
    continuations,
    encode_choices,
    encode_pair,
    judge,
    mean_stderr,
    score_requests,
)

__all__ = ["Example", "read_examples", "DemoPool", "build_prompt", "continuations",
           "encode_pair", "encode_choices", "score_requests", "argmax", "Judged", "judge",
           "mean_stderr", "TARGET_DELIMITER", "FEWSHOT_DELIMITER"]
