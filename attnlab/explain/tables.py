"""Matrices as a terminal shows them: labelled by their tokens, whole where they fit.

A token × token matrix (attention weights, scores, a mask) is shown with the tokens along both
edges: rows are the queries (the attending positions), columns the keys. Up to
:data:`WHOLE` tokens it is shown whole; a longer one keeps its first and last
:data:`WHOLE` / 2 tokens and cuts the middle, so the last rows, the ones a decoder's next token
is read from, and the last columns ([SEP], the newest token) are always there. A token ×
dimension matrix (embeddings, Q, K, V) keeps its token rows by the same rule and shows the
first ``dims`` dimensions.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

WHOLE = 16  # a sequence up to this long is shown whole; a longer one loses its middle
LABEL = 12  # characters of a token label at most


def label(token: str) -> str:
    """A token as a label: spaces at its ends made visible (GPT's pieces begin with one),
    control characters escaped, long pieces shortened."""
    text = token.encode("unicode_escape").decode("ascii") if not token.isprintable() else token
    core = text.strip(" ")
    lead, trail = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
    text = "␣" * lead + core + "␣" * trail if core else "␣" * len(text)
    return text if len(text) <= LABEL else text[: LABEL - 1] + "…"


def kept(n: int, whole: int = WHOLE) -> list[int | None]:
    """The indices of ``n`` shown: all of them up to ``whole``, else the first and last
    ``whole // 2`` with ``None`` where the middle is cut."""
    if n <= whole:
        return list(range(n))
    half = whole // 2
    return [*range(half), None, *range(n - half, n)]


def _cell(x, floating: bool, signed: bool) -> str:
    if not floating:
        return f"{int(x):d}"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def format_matrix(value: Tensor, rows: list[str] | None = None, cols: list[str] | None = None,
                  dims: int = 6) -> str:
    """``value (r, c)`` (or ``(c,)``) as labelled text lines, two spaces of indent.

    ``rows``/``cols`` label the rows and columns (tokens); labelled columns are shown whole up
    to :data:`WHOLE` (cut in the middle beyond), unlabelled ones (dimensions) as the first
    ``dims``. Rows follow the token rule whether labelled or not."""
    a = value.detach().cpu()
    a = (a.float() if a.is_floating_point() else a.long()).numpy()
    if a.ndim == 1:
        a = a[None]
    floating = np.issubdtype(a.dtype, np.floating)
    signed = bool((a < 0).any())  # probabilities and weights need no sign
    row_idx = kept(a.shape[0])
    if cols is not None:
        col_idx: list[int | None] = kept(a.shape[1])
    else:
        col_idx = list(range(min(dims, a.shape[1]))) + ([None] if a.shape[1] > dims else [])
    width = max(7 if floating else 2, *(len(label(c)) for c in cols or [""]))
    row_width = max([len(label(r)) for r in rows] if rows else [0])
    lines = []
    if cols is not None:
        head = " ".join("…".rjust(width) if j is None else label(cols[j]).rjust(width)
                        for j in col_idx)
        lines.append("  " + " " * (row_width + 2 if rows else 1) + head)
    for i in row_idx:
        if i is None:
            lines.append("  " + " " * (row_width + 2 if rows else 1) + "⋮")
            continue
        cells = " ".join(("…" if j is None else _cell(a[i, j], floating, signed)).rjust(width)
                         for j in col_idx)
        name = label(rows[i]).ljust(row_width) + " " if rows else ""
        lines.append(f"  {name}[{cells}]")
    return "\n".join(lines)


__all__ = ["format_matrix", "label", "kept", "WHOLE"]
