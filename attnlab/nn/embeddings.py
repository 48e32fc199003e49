"""Token embeddings (paper section 3.4).

    Emb(ids) = E[ids] · √d_model        E: (vocab, d_model)

The paper multiplies by √d_model because the same matrix E is shared with the pre-softmax
projection, where small (≈1/√d_model) entries suit; scaling brings the embeddings up to the
magnitude of the positional encodings they are added to. GPT and BERT do not scale.

Shapes: ``ids (batch, seq)`` -> ``(batch, seq, d_model)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput


class TokenEmbedding(nn.Module):
    """``E[ids] · scale`` with ``scale = √d_model`` when ``scale_by_sqrt_d`` is set, else 1.
    ``out_dtype``: the rows widened to it (a 16-bit table feeding float32 activations, as
    :func:`~attnlab.cpu.prepare.float32_activations_` sets); None: ``E``'s own."""

    out_dtype: torch.dtype | None = None

    def __init__(self, vocab_size: int, d_model: int, scale_by_sqrt_d: bool = True,
                 init_std: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5 if init_std is None else init_std)
        self.scale = math.sqrt(d_model) if scale_by_sqrt_d else 1.0

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def forward(self, ids: Tensor) -> Tensor:
        # A clear error instead of an index assert; skipped on CUDA, where it would sync, and
        # in a compiled or exported graph (ONNX), which cannot raise.
        if not ids.is_cuda and not torch.compiler.is_compiling() and ids.numel() and (
            int(ids.max()) >= self.vocab_size or int(ids.min()) < 0
        ):
            raise BadInput(
                f"token ids must lie in [0, {self.vocab_size}); "
                f"got {int(ids.min())}..{int(ids.max())}"
            )
        x = nn.functional.embedding(ids, self.weight)
        if self.out_dtype is not None:
            x = x.to(self.out_dtype)
        return x * self.scale if self.scale != 1.0 else x
