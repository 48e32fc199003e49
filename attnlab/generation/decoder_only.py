"""Deprecated: the old home of decoder-only generation, kept for one release.

Its pieces now live where they belong: the loop and its sampling step in
:mod:`attnlab.generation.decode`, the text streams in the decoding pipeline,
:mod:`attnlab.generation.pipeline`, and the CPU preparation (``for_decoding``) in
:mod:`attnlab.cpu`. Each name read from here still works, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import importlib
import warnings

_MOVED = {
    "generate": "attnlab.generation.decode",
    "check_decoding": "attnlab.generation.decode",
    "filter_logits": "attnlab.generation.decode",
    "penalise_repeats": "attnlab.generation.decode",
    "TextStream": "attnlab.generation.pipeline",
    "StopStream": "attnlab.generation.pipeline",
    "for_decoding": "attnlab.cpu.prepare",
    "float32_activations_": "attnlab.cpu.prepare",
    "integer_head": "attnlab.cpu.prepare",
}


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _MOVED[name]
    warnings.warn(f"attnlab.generation.decoder_only.{name} moved to {home}.{name}; the old path "
                  "goes in the next release", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(_MOVED)
