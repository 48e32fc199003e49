"""attnlab.models: thin compositions of the shared blocks, one class per family."""

from __future__ import annotations

from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer

FAMILIES: dict[str, type[nn.Module]] = {"encoder-decoder": Transformer, "decoder": GPT}


def build_model(config: ModelConfig) -> nn.Module:
    """The model class the config's ``arch`` names."""
    if config.arch not in FAMILIES:
        raise ValueError(f"config field arch={config.arch!r}: no model family implements it yet")
    return FAMILIES[config.arch](config)


__all__ = ["Transformer", "GPT", "build_model", "FAMILIES"]
