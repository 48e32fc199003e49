"""Softmax of [2, 1, 0.1] (the first text) and the cosine similarity and Euclidean distance
of "cat" and "dog" (the mathematics text), checked against torch.

    softmax(s)_i = e^{s_i} / Σ_j e^{s_j}
    cos(A, B) = A·B / (‖A‖·‖B‖),   d(A, B) = ‖A − B‖
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.explain.examples.base import ExampleResult, diff

WORDS = ["money", "bank", "grows"]


def softmax(r: ExampleResult) -> None:
    s = r.step("s (given)", "scaled scores of \"money\" against each word", [2.0, 1.0, 0.1],
               cols=WORDS)
    e = r.step("e^s", "exponentials", torch.exp(s), cols=WORDS)
    r.compare("e^s", "[7.389, 2.718, 1.105]", e)
    total = r.step("Σ e^s", "the denominator", e.sum())
    r.compare("Σ e^s", "11.212", total,
              why="the text adds its rounded exponentials, 7.389 + 2.718 + 1.105 = 11.212; "
                  "unrounded the sum is 11.2125")
    w = r.step("softmax(s)", "e^s / Σ e^s", e / total, cols=WORDS)
    r.compare("softmax(s)", "[0.659, 0.242, 0.099]", w)
    r.compare("Σ softmax(s)", "1.000", r.step("Σ softmax(s)", "always 1", w.sum()))
    r.check("softmax(s) vs torch.softmax", diff(w, torch.softmax(s, -1)), 1e-15)
    r.check("softmax is unchanged by a shift of all scores", diff(
        w, torch.softmax(s - s.max(), -1)), 1e-15)


def similarity(r: ExampleResult) -> None:
    a = r.step("A (given, \"cat\")", "3-dimensional word vector", [0.8, 0.2, 0.1])
    b = r.step("B (given, \"dog\")", "3-dimensional word vector", [0.7, 0.3, 0.2])
    dot = r.step("A·B", "Σ a_i·b_i", a @ b)
    r.compare("A·B", "0.64", dot)
    norms = r.step("‖A‖, ‖B‖", "√Σ a_i², √Σ b_i²", torch.stack([a.norm(), b.norm()]))
    r.compare("‖A‖, ‖B‖", "[0.83, 0.79]", norms)
    product = r.step("‖A‖·‖B‖", "√0.69·√0.62", norms.prod())
    r.compare("‖A‖·‖B‖", "0.66", product,
              why="the text multiplies its rounded norms, 0.83·0.79 = 0.656; √0.69·√0.62 = "
                  "0.654")
    cos = r.step("cos(A, B)", "A·B / (‖A‖·‖B‖)", dot / product)
    r.compare("cos(A, B)", "0.97", cos,
              why="the text divides by its twice-rounded 0.66: 0.64/0.66 = 0.970; "
                  "0.64/0.654 = 0.978")
    dist = r.step("‖A − B‖", "√Σ (a_i − b_i)²", (a - b).norm())
    r.compare("Σ (a_i − b_i)²", "0.03", r.step("Σ (a_i − b_i)²", "squared distance",
                                              ((a - b) ** 2).sum()))
    r.compare("‖A − B‖", "0.17", dist)
    r.check("cos vs torch.nn.functional.cosine_similarity",
            diff(cos, F.cosine_similarity(a, b, dim=0)), 1e-15)
    r.check("‖A − B‖ vs torch.dist", diff(dist, torch.dist(a, b)), 1e-15)
