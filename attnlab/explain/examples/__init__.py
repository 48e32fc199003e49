"""The course's worked examples, recomputed: each takes the inputs its text states, recomputes
every intermediate, sets the text's printed values against the recomputation (saying why
where they differ) and checks the result against independent references.

    list_examples()          every example: name, title, course source
    run_example(name)        an :class:`ExampleResult` (steps, printed values, checks)
    format_example(result)   the result as terminal text
"""

from __future__ import annotations

from attnlab.errors import BadInput
from attnlab.explain.examples import (
    attention,
    basics,
    forward_pass,
    norms,
    positions,
    tiny_attention,
    training,
)
from attnlab.explain.examples.base import Example, ExampleResult, Printed, Step
from attnlab.explain.examples.report import format_example, format_list

MATH = "3-mathematics-of-transformers.txt"
GUIDE = "2-attention-is-all-you-need-guide.txt"
FIRST = "1-self-attention-and-encoder.txt"
BERT = "4-bert-gpt-training-fine-tuning.txt"
NETWORK = "5-transformer-network-forward-pass.txt"

EXAMPLES = [
    Example("tiny-attention", "one head, two tokens: forward, then every gradient",
            f"{MATH} §9.1–9.2 (lines 1520–1620)", tiny_attention.tiny_attention),
    Example("softmax", "softmax of [2, 1, 0.1]",
            f"{FIRST} \"Detailed Softmax Calculation Example\" (lines 666–692)", basics.softmax),
    Example("similarity", "cosine similarity and Euclidean distance of \"cat\" and \"dog\"",
            f"{MATH} §4.2.1–4.2.2 (lines 784–822)", basics.similarity),
    Example("gradient-descent", "gradient descent on f(x) = x² from x = 3, α = 0.1",
            f"{MATH} §2.1.1 \"Worked Example: f(x) = x²\" (lines 93–122)",
            training.gradient_descent),
    Example("layernorm", "LayerNorm of [2, 4, 6, 8] and of \"Hi\"",
            f"{GUIDE} \"Layer Normalization\" (lines 839–862); {NETWORK} §7.4 (lines "
            f"1411–1433); {FIRST} \"Concrete Example\" (lines 2350–2381)", norms.layer_norm),
    Example("batchnorm", "BatchNorm of x = [7, 2, 5, 4], γ = 0.5, β = 0.1",
            f"{FIRST} \"Numerical Example: Single Neuron\" (lines 2123–2148)", norms.batch_norm),
    Example("batchnorm-vs-layernorm", "a batch × neurons table: columns (BatchNorm) against "
            "rows (LayerNorm), padding, a batch of 1",
            f"{FIRST} \"Detailed Network Example\", \"Why Batch Normalization Fails\" (lines "
            "2150–2324)", norms.batch_vs_layer_norm),
    Example("positional-encoding", "the sinusoidal table: d = 4, d = 6, d = 512; embeddings "
            "plus positions",
            f"{GUIDE} (lines 570–599, 1172–1189); {FIRST} (lines 1245–1317); {NETWORK} "
            "(lines 585–676)", positions.positional_encoding),
    Example("self-attention-steps", "\"The cat sat\": q₁ = x₁·W^Q, scores, softmax, output",
            f"{GUIDE} \"Self-Attention in Detail\" (lines 151–325)",
            attention.guide_self_attention),
    Example("guide-example-1", "three words, identity weights: Q = K = V = X",
            f"{GUIDE} \"Example 1: Simple Attention Calculation\" (lines 1075–1170)",
            attention.guide_example_1),
    Example("it-attention", "the query of \"it\" against \"cat\", \"sat\", \"mat\", \"it\"",
            f"{BERT} \"Understanding Attention Scores\" (lines 1144–1290)",
            attention.it_attention),
    Example("causal-row", "the decoder's scores under the causal mask, softmaxed",
            f"{NETWORK} \"Causal Mask Visualization\" (lines 995–1076)", attention.causal_row),
    Example("forward-pass", "\"I love\" through a d_model = 4 encoder–decoder to the first "
            "token", f"{NETWORK} \"Complete Forward Pass Example\" (lines 1462–1672)",
            forward_pass.forward_pass),
    Example("label-smoothing", "label smoothing, K = 5, ε = 0.1, and its loss",
            f"{GUIDE} \"Label Smoothing\" (lines 1014–1035); {BERT} (lines 5048–5056)",
            training.label_smoothing),
    Example("lr-peak", "the learning-rate schedule, d = 512, warm-up 4000: its peak",
            f"{GUIDE} \"Optimization\" (lines 987–1012)", training.lr_peak),
    Example("sequence-loss", "the teacher-forced loss of \"Je t'aime <E>\"",
            f"{NETWORK} \"Training vs Inference\", loss (lines 1790–1808)",
            training.sequence_loss),
]


def list_examples() -> list[Example]:
    return list(EXAMPLES)


def run_example(name: str) -> ExampleResult:
    """Recompute the example ``name``; :class:`BadInput` naming the known ones otherwise."""
    found = {e.name: e for e in EXAMPLES}.get(name)
    if found is None:
        raise BadInput(f"no worked example {name!r}; known: "
                       f"{', '.join(e.name for e in EXAMPLES)}")
    result = ExampleResult(found)
    found.run(result)
    return result


__all__ = ["list_examples", "run_example", "format_example", "format_list", "Example",
           "ExampleResult", "Printed", "Step", "EXAMPLES"]
