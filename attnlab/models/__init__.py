"""attnlab.models: thin compositions of the shared blocks."""

from attnlab.models.transformer import Transformer

__all__ = ["Transformer"]
