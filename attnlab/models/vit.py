"""The Vision Transformer (Dosovitskiy et al., 2021): the encoder, run on image patches.

    z₀ = [x_cls; x_p¹E; …; x_pᴺE] + E_pos        (batch, 1 + N, D), then dropout   (Eq. 1)
    z_l = EncoderLayer(z_{l-1})                     l = 1..L, bidirectional, pre-LN, GELU
    y   = LN(z_L)[:, 0]                             (batch, D): the [CLS] vector    (Eq. 4)

The patch embedding (:class:`attnlab.nn.PatchEmbedding`: a convolution with kernel = stride =
P, the [CLS] vector, learned positions) is the only new part; the stack is attnlab's
:class:`~attnlab.nn.Encoder` as the config describes it (``norm_placement="pre"`` gives the
paper's pre-LN blocks and the final LN, Eqs. 2–4). There is no padding: every image of a batch
has the same N = (image_size / patch_size)² patches. Heads (``config.head``):

    classify   W_c · y + b_c      (batch, num_labels), as transformers' ViTForImageClassification
    none       LN(z_L)            (batch, 1 + N, D): the hidden states, [CLS] first

(no tanh pooler: fine-tuned ViTs classify from y directly). ``config.max_len`` is not read:
the positions are 1 + N.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.nn import Encoder, PatchEmbedding


class ViT(nn.Module):
    """Image classifier (or encoder) from the shared blocks; see the module docstring.

    ``encode(images, need_weights=True)`` leaves each layer's attention weights
    ``(batch, heads, 1 + N, 1 + N)`` in ``self.encoder.layers[l].attn_weights`` (query and key
    0 are [CLS]; patch i sits at row i // grid, column i % grid of the image)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch != "vision":
            raise BadInput(f"ViT needs arch='vision', got {config.arch!r}")
        self.config = config
        d = config.d_model
        self.patch_embed = PatchEmbedding(config.image_size, config.patch_size,
                                          config.num_channels, d)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.classifier = nn.Linear(d, config.num_labels) if config.head == "classify" else None
        self._init_weights()

    def _init_weights(self, std: float = 0.02) -> None:
        """As transformers' ViT: a normal of std 0.02 truncated at ±2σ for every matrix, the
        patch kernel, [CLS] and the positions; zero biases; unit norm gains."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.trunc_normal_(p, std=std, a=-2 * std, b=2 * std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    @property
    def n_patches(self) -> int:
        """N, the patches of an image (the sequence is N + 1 long)."""
        return self.patch_embed.n_patches

    # --- the encoder -----------------------------------------------------------------------
    def embeddings(self, images: Tensor) -> Tensor:
        """``z₀``, before dropout: ``images (batch, C, H, W)`` -> ``(batch, 1 + N, D)``."""
        return self.patch_embed(images)

    def encode(self, images: Tensor, need_weights: bool = False) -> Tensor:
        """The final-normed states ``LN(z_L) (batch, 1 + N, D)`` of ``images (batch, C, H,
        W)``; every position attends to every position."""
        return self.encoder(self.embed_dropout(self.embeddings(images)),
                            need_weights=need_weights)

    def forward(self, images: Tensor, need_weights: bool = False) -> Tensor:
        """The head's output: logits ``(batch, num_labels)`` for ``classify``, the hidden
        states ``(batch, 1 + N, D)`` for ``none``."""
        h = self.encode(images, need_weights)
        return h if self.classifier is None else self.classifier(h[:, 0])

    def components(self) -> OrderedDict[str, list[nn.Module]]:
        parts = OrderedDict([("patch embedding", [self.patch_embed]),
                             ("encoder layer (one)", list(self.encoder.layers[:1])),
                             ("encoder", [self.encoder])])
        if self.classifier is not None:
            parts["classifier"] = [self.classifier]
        return parts
