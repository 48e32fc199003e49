"""Training in tests runs to a stated criterion, never a fixed step count: how many steps a
model needs depends on the machine's float rounding (AMX, AVX-512, AVX2 and ARM all differ),
so a fixed count passes on one CPU and fails on another. A cap that is reached fails loudly."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def train_until(step: Callable[[], object], done: Callable[[], tuple[bool, str]],
                what: str, every: int, cap: int, unit: str = "steps") -> int:
    """Call ``step`` ``every`` times, then ``done`` (``(met, description)``), until it is met;
    fail the test if ``cap`` calls of ``step`` (counted in ``unit``) pass first. Returns the
    calls taken."""
    taken = 0
    while taken < cap:
        for _ in range(every):
            step()
        taken += every
        met, description = done()
        if met:
            return taken
    pytest.fail(f"{what}: criterion not met after {cap} {unit} (the cap); last check: "
                f"{description}")
