"""Matrices in the terminal: labelled by their tokens, whole up to 16 tokens, cut in the middle
beyond (never at the end), each printed number the matrix's own."""

from __future__ import annotations

import torch

from attnlab.explain.tables import WHOLE, format_matrix, kept, label


def _numbers(line: str) -> list[float]:
    inside = line[line.index("[") + 1 : line.rindex("]")]
    return [float(x) for x in inside.split() if x != "…"]


def test_a_token_by_token_matrix_is_labelled_both_ways_and_whole_up_to_sixteen():
    tokens = [f"t{i}" for i in range(WHOLE)]
    a = torch.rand(WHOLE, WHOLE).softmax(-1)
    lines = format_matrix(a, tokens, tokens).splitlines()
    assert lines[0].split() == tokens  # the header: every column's token
    body = lines[1:]
    assert len(body) == WHOLE and "⋮" not in "".join(body)
    for i, line in enumerate(body):
        assert line.split()[0] == tokens[i]
        assert _numbers(line) == [round(float(x), 4) for x in a[i]]


def test_a_longer_matrix_loses_its_middle_and_keeps_its_last_rows_and_columns():
    n = WHOLE + 7
    tokens = [f"w{i}" for i in range(n)]
    a = torch.arange(n * n, dtype=torch.float32).reshape(n, n) / (n * n)
    lines = format_matrix(a, tokens, tokens).splitlines()
    head = lines[0].split()
    assert head[0] == "w0" and head[-1] == f"w{n - 1}" and "…" in head
    rows = [line.split()[0] for line in lines[1:] if "⋮" not in line]
    assert rows[0] == "w0" and rows[-1] == f"w{n - 1}" and len(rows) == WHOLE
    assert sum("⋮" in line for line in lines) == 1
    last = lines[-1]
    assert _numbers(last) == [round(float(a[n - 1, j]), 4) for j in kept(n) if j is not None]


def test_token_by_dimension_rows_keep_their_tokens_and_show_the_first_dims():
    a = torch.randn(3, 10)
    lines = format_matrix(a, ["the", "cat", "sat"], dims=4).splitlines()
    assert [line.split()[0] for line in lines] == ["the", "cat", "sat"]
    for i, line in enumerate(lines):
        assert _numbers(line) == [round(float(x), 4) for x in a[i, :4]] and "…" in line


def test_labels_show_leading_spaces_and_escape_control_characters():
    assert label(" the") == "␣the" and label("\n") == "\\n"
    assert len(label("x" * 40)) <= 12
