"""Deprecated: the old home of decoder-only generation, kept for one release.

Its pieces now live where they belong: the loop in :mod:`attnlab.generation.decode`, the
sampling step in :mod:`attnlab.generation.sampling`, the text streams in
:mod:`attnlab.generation.streams`, and the CPU preparation (``for_decoding``) in
:mod:`attnlab.cpu`. Each name read from here still works, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import importlib
import warnings

_MOVED = {
    "generate": "attnlab.generation.decode",
    "check_decoding": "attnlab.generation.sampling",
    "filter_logits": "attnlab.generation.sampling",
    "penalise_repeats": "attnlab.generation.sampling",
    "TextStream": "attnlab.generation.streams",
    "StopStream": "attnlab.generation.streams",
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
