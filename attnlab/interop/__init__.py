"""attnlab.interop: checkpoints from and to the Hugging Face ecosystem, with no hub access."""

from attnlab.interop import hf_bert, hf_decoders  # noqa: F401  (register bert, gpt2, llama)
from attnlab.interop.huggingface import FAMILIES, from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "FAMILIES"]
