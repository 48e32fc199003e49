"""The start every task shares: a pretrained encoder (BERT, MiniLM) with a new head on its
copied weights. The classifier (:mod:`attnlab.tasks.classify`), named-entity
(:mod:`attnlab.tasks.ner`) and question-answering (:mod:`attnlab.tasks.qa`) recipes build
their model with :func:`from_encoder`; the two token-level ones load it with
:func:`token_encoder`."""

from __future__ import annotations

from torch import nn

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.storage import Loaded, load


def token_encoder(init: str, command: str, max_len: int) -> tuple[Loaded, int]:
    """The pretrained encoder that a token-level task (NER, QA) starts from, and
    the longest input it takes: ``max_len`` capped at the model's positions, not at a sentence
    encoder's shorter cap (MiniLM's 256). Its tokenizer must be WordPiece: predictions map
    back to words and characters through it."""
    base = load(init).expect("encoder", f"train {command}")
    if not hasattr(base.tokenizer, "backend"):
        raise BadInput(f"{init}: train {command} needs a WordPiece tokenizer (a BERT-family "
                       "model), not a character or word one")
    return base, min(max_len, base.config.max_len - base.config.position_offset)


def from_encoder(config: ModelConfig, base: nn.Module, init: str) -> nn.Module:
    """A model of ``config`` (an encoder with a new head) whose encoder (and pooler, when it
    has one) is copied from ``base``; the new head starts at N(0, 0.02)."""
    model = build_model(config)
    heads = ("mlm.", "nsp.", "classifier.", "qa.", "discriminator.") + (
        () if model.pooler else ("pooler.",))
    state = {k: v for k, v in base.state_dict().items() if not k.startswith(heads)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(("pooler.", "classifier.", "qa.")) for k in missing):
        raise BadInput(f"{init}: encoder weights do not fit (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    return model
