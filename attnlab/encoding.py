"""Deprecated: :mod:`attnlab.sentence_encoder` holds what this module held (``load_encoder``,
``SentenceEncoder``, ``embed_sentences``, ``token_vectors``), and
:mod:`attnlab.tasks.classify` holds ``classify_texts``. Importing this module still works, with
a ``DeprecationWarning``, for one release."""

from __future__ import annotations

import warnings

from attnlab.sentence_encoder import (  # noqa: F401  (the old public names)
    MINILM,
    SentenceEncoder,
    embed_sentences,
    load_encoder,
    minilm_path,
    token_vectors,
)

warnings.warn("attnlab.encoding is deprecated and goes in the next release: import "
              "load_encoder, SentenceEncoder, embed_sentences and token_vectors from "
              "attnlab.sentence_encoder, classify_texts from attnlab.tasks.classify",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    if name == "classify_texts":  # above this module's layer: named, not imported
        raise AttributeError("attnlab.encoding.classify_texts moved to "
                             "attnlab.tasks.classify.classify_texts")
    raise AttributeError(f"module 'attnlab.encoding' has no attribute {name!r}")
