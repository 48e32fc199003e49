"""Deprecated: the old name of :mod:`attnlab.generation.seq2seq` (encoder–decoder decoding),
kept for one release. Each name read from here still works, with a ``DeprecationWarning``."""

from __future__ import annotations

import warnings

from attnlab.generation import seq2seq as _seq2seq


def __getattr__(name: str):
    value = getattr(_seq2seq, name)  # (an AttributeError names what is missing)
    warnings.warn(f"attnlab.generation.translation.{name} moved to "
                  f"attnlab.generation.seq2seq.{name}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return value
