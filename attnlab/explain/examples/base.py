"""What a worked example is made of: its steps, the course's printed values set against the
recomputation, and the checks against independent references.

An example takes the inputs its course text states, recomputes every intermediate in float64
and records:

- a :class:`Step` per intermediate (a named tensor, with the formula that made it);
- a :class:`Printed` per value the text prints: the text as printed, the value recomputed
  here, and, where they differ by more than the text's own printed precision, why;
- a :class:`~attnlab.explain.walkthrough.Check` per comparison with an independent reference
  (``torch.nn``, attnlab's own modules, autograd, finite differences).

A printed value "differs" when ``|course − recomputed| > ½·10^(−decimals)`` for any entry,
``decimals`` being the number of digits the text printed after the point for that entry: the
text could not have printed it by rounding the recomputed value.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from attnlab.explain.walkthrough import Check

NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


def tensor(value) -> Tensor:
    """Anything array-like as a float64 tensor (the precision every example computes in)."""
    if isinstance(value, Tensor):
        return value.detach().to(torch.float64)
    return torch.as_tensor(np.asarray(value, dtype=np.float64))


def parse_printed(text: str) -> tuple[Tensor, Tensor]:
    """``"[0.795, -0.595, 0.24]"`` -> (values, decimals printed per entry), both float64,
    of the nested list's shape."""
    values = tensor(ast.literal_eval(text))
    digits = [len(m.group(1) or "") for m in NUMBER.finditer(text)]
    return values, tensor(digits).reshape(values.shape)


def diff(a, b) -> float:
    """The largest absolute difference, in float64."""
    return float((tensor(a) - tensor(b)).abs().max())


@dataclass
class Step:
    name: str
    formula: str
    value: Tensor
    rows: list[str] | None = None  # labels of a matrix's rows (tokens) and columns
    cols: list[str] | None = None


@dataclass
class Printed:
    """One value as the course prints it, against the value recomputed from its inputs."""

    what: str
    text: str  # exactly as the course prints it
    course: Tensor
    decimals: Tensor
    recomputed: Tensor
    why: str = ""  # why they differ: given exactly when they do

    @property
    def excess(self) -> float:
        """How far the worst entry lies outside what rounding could explain (≤ 0: none)."""
        half_unit = 0.5 * 10.0 ** (-self.decimals)
        return float(((self.course - self.recomputed).abs() - half_unit * (1 + 1e-9)).max())

    @property
    def differs(self) -> bool:
        return self.excess > 0


@dataclass
class Example:
    name: str
    title: str
    source: str  # course file and section (lines)
    run: Callable[[ExampleResult], None] = field(repr=False)  # fills a result in


@dataclass
class ExampleResult:
    """Everything one example computed; the example functions fill it in order."""

    example: Example
    steps: list[Step] = field(default_factory=list)
    printed: list[Printed] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def values(self) -> dict[str, Tensor]:
        """The intermediates by name."""
        return {s.name: s.value for s in self.steps}

    @property
    def discrepancies(self) -> list[Printed]:
        """The printed values that the stated inputs do not give."""
        return [p for p in self.printed if p.differs]

    def step(self, name: str, formula: str, value, rows: list[str] | None = None,
             cols: list[str] | None = None) -> Tensor:
        """Record an intermediate; returns it as a float64 tensor."""
        t = tensor(value)
        self.steps.append(Step(name, formula, t, rows, cols))
        return t

    def compare(self, what: str, text: str, recomputed, why: str = "") -> Printed:
        """Set the course's printed ``text`` against the recomputed value (same shape)."""
        course, decimals = parse_printed(text)
        rec = tensor(recomputed).reshape(course.shape)
        p = Printed(what, text, course, decimals, rec, why)
        self.printed.append(p)
        return p

    def check(self, name: str, error: float, tol: float) -> None:
        self.checks.append(Check(name, error, tol))

    def note(self, line: str) -> None:
        self.notes.append(line)


def softmax_rows(s: Tensor) -> Tensor:
    """softmax(s)_j = e^{s_j} / Σ_k e^{s_k} over the last axis, written out (−∞ gives 0)."""
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def layer_norm_rows(x: Tensor, eps: float = 1e-5) -> Tensor:
    """(x − μ) / √(σ² + ε) per row, μ and σ² (biased) over the row's features."""
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)
