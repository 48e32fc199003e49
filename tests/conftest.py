"""Shared fixtures: deterministic seeds, and float32 comparisons at 1e-5 unless said."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
