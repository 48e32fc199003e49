"""attnlab.models: thin compositions of the shared blocks, one class per family."""

from __future__ import annotations

from torch import nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.models.bert import BERT, mean_pool
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer

# the model class of each ModelConfig.arch (the Hugging Face model families are
# attnlab.interop.FAMILIES)
ARCHITECTURES: dict[str, type[nn.Module]] = {"encoder-decoder": Transformer, "decoder": GPT,
                                             "encoder": BERT}


def build_model(config: ModelConfig) -> nn.Module:
    """The model class the config's ``arch`` names."""
    if config.arch not in ARCHITECTURES:
        raise BadInput(f"config field arch={config.arch!r}: no model family implements it yet")
    return ARCHITECTURES[config.arch](config)


__all__ = ["Transformer", "GPT", "BERT", "mean_pool", "build_model", "ARCHITECTURES"]
