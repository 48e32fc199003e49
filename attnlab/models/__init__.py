"""attnlab.models: thin compositions of the shared blocks, one class per family."""

from __future__ import annotations

from torch import nn

from attnlab.models.bert import BERT, mean_pool
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.models.vit import ViT

# the model class of each ModelConfig.arch (the Hugging Face model families are
# attnlab.interop.FAMILIES)
ARCHITECTURES: dict[str, type[nn.Module]] = {"encoder-decoder": Transformer, "decoder": GPT,
                                             "encoder": BERT, "vision": ViT}


__all__ = ["Transformer", "GPT", "BERT", "ViT", "mean_pool", "ARCHITECTURES"]
