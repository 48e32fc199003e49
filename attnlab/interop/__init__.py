"""attnlab.interop: checkpoints from and to the Hugging Face ecosystem, with no hub access."""

from attnlab.interop import (  # noqa: F401  (register families)
    hf_bert,
    hf_decoders,
    hf_encoders,
    hf_longformer,
    hf_marian,
    hf_t5,
    hf_vit,
)
from attnlab.interop.huggingface import FAMILIES, from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "FAMILIES"]
