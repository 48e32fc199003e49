"""The worked examples as terminal text: the list, and one example's steps, its printed values
against the recomputation, and its checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnlab.explain.report import check_lines
from attnlab.explain.tables import format_matrix

if TYPE_CHECKING:
    from attnlab.explain.examples.base import Example, ExampleResult, Printed


def format_list(examples: list[Example]) -> str:
    width = max(len(e.name) for e in examples)
    lines = ["the course's worked examples (attnlab explain --example NAME):"]
    for e in examples:
        lines += [f"  {e.name.ljust(width)}  {e.title}", f"  {' ' * width}  from {e.source}"]
    return "\n".join(lines)


def _inline(value, places: int) -> str:
    """A small array on one line, in the course's bracket style."""
    a = np.asarray(value)
    if a.ndim == 0:
        return f"{float(a):.{places}f}"
    return "[" + ", ".join(_inline(x, places) for x in a) + "]"


def _printed_lines(p: Printed) -> list[str]:
    places = max(4, int(p.decimals.max()) + 1)
    recomputed = _inline(p.recomputed.numpy(), places)
    if not p.differs:
        return [f"  {p.what}: the text prints {p.text}; recomputed {recomputed}: agrees to "
                "its printed precision"]
    return [f"  {p.what}: DIFFERS",
            f"      the text prints:  {p.text}",
            f"      recomputed:       {recomputed} (from the inputs the text states: right)",
            f"      why:              {p.why}"]


def format_example(r: ExampleResult) -> str:
    e = r.example
    out = [f"worked example {e.name}: {e.title}", f"course: {e.source}",
           "every value recomputed here in float64 from the inputs the text states", ""]
    for n, s in enumerate(r.steps, 1):
        shape = f"  shape {tuple(s.value.shape)}" if s.value.ndim else ""
        out.append(f"{n:2d}. {s.name}: {s.formula}{shape}")
        if s.value.ndim == 0:
            out.append(f"  {float(s.value):.6g}")
        else:
            out.append(format_matrix(s.value, s.rows, s.cols, dims=16))
    if r.notes:
        out += ["", "notes:", *(f"  {line}" for line in r.notes)]
    wrong = r.discrepancies
    out += ["", f"the text's printed values ({len(r.printed)}; {len(wrong)} differ from the "
                "recomputation beyond the text's own rounding):",
            *(line for p in r.printed for line in _printed_lines(p))]
    out += ["", "checks (each computed now):", *check_lines(r)]
    passed = sum(c.ok for c in r.checks)
    out.append(f"  {passed} of {len(r.checks)} checks passed")
    return "\n".join(out)
