"""Code comments and docstrings state formulas, shapes and reasons; measured times, speeds and
bandwidths, and the names of the machines they were measured on, live in docs/benchmarks.md,
where they are kept current (a comment's figure goes stale with every kernel change)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlab"

# a number with a unit of time, speed or bandwidth; a benchmark machine's name
MEASURED = re.compile(
    r"\d+(?:[.,]\d+)*(?:\s*(?:ms|µs|ns|tokens/s|tok/s|GB/s|GiB/s|MB/s|it/s)|\s+(?:s|us|"
    r"seconds|minutes))(?![\w/])")
MACHINE = re.compile(r"\b(?:EPYC|Xeon|Sapphire Rapids|Ice Lake|Zen ?\d|Graviton|Apple M\d)\b")


def prose(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring line of a module's source."""
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno
                found += [(first + i, line) for i, line in enumerate(doc.splitlines())]
    return found


def test_the_checker_finds_a_measured_time_and_a_machine():
    source = '"""Reads at 17 GB/s."""\nx = 1  # 1.1 ms of a 12 ms token on a 2-core Zen 4\n'
    hits = [text for _, text in prose(source) if MEASURED.search(text) or MACHINE.search(text)]
    assert len(hits) == 2
    clean = '"""softmax(QKᵀ/√d_k)V, (batch, heads, len, d_k)."""\nx = 1  # 8 rows: 2 products\n'
    assert [t for _, t in prose(clean) if MEASURED.search(t) or MACHINE.search(t)] == []


def test_no_comment_or_docstring_states_a_measured_time_or_a_machine():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, text in prose(path.read_text())
             if MEASURED.search(text) or MACHINE.search(text)]
    assert found == []
