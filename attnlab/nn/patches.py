"""Patch embedding: an image as a sequence of tokens (ViT, Dosovitskiy et al., 2021, Eq. 1).

An image ``x ∈ R^{H×W×C}`` is cut into ``N = HW / P²`` square patches of ``P × P`` pixels,
each flattened into a vector, ``x_p ∈ R^{N×(P²·C)}``; a shared linear map ``E ∈ R^{(P²·C)×D}``
embeds every patch, a learned ``x_cls`` is put first (its final state is the image's summary)
and a learned position is added to each of the ``N + 1`` tokens:

    z₀ = [x_cls; x_p¹E; x_p²E; …; x_pᴺE] + E_pos        E_pos ∈ R^{(N+1)×D}

Embedding every non-overlapping patch by the same matrix is a convolution whose kernel and
stride are both P, so ``E`` is kept as ``Conv2d(C, D, kernel_size=P, stride=P)`` (its weight
``(D, C, P, P)`` is E with each patch's pixels ordered channel, row, column), plus a bias.
Patches are numbered row by row, left to right.

Shapes: ``images (batch, C, H, W)`` -> ``(batch, 1 + N, D)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput


class PatchEmbedding(nn.Module):
    """``z₀`` of the module docstring for square ``image_size²`` images of ``num_channels``
    channels. Parameters: ``projection`` (the conv: E and its bias), ``cls (1, 1, D)``,
    ``positions (1, 1 + N, D)``."""

    def __init__(self, image_size: int, patch_size: int, num_channels: int, d_model: int):
        super().__init__()
        if image_size % patch_size:
            raise BadInput(f"image_size={image_size} is not divisible by "
                           f"patch_size={patch_size}")
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels
        self.grid = image_size // patch_size  # patches along each side
        self.n_patches = self.grid**2
        self.projection = nn.Conv2d(num_channels, d_model, kernel_size=patch_size,
                                    stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.positions = nn.Parameter(torch.zeros(1, 1 + self.n_patches, d_model))

    def check(self, images: Tensor) -> None:
        """A one-line BadInput unless ``images`` is ``(batch, C, H, W)`` with the configured
        C and H = W = image_size."""
        expected = (self.num_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            c, s = expected[0], expected[1]
            raise BadInput(f"images must be (batch, {c}, {s}, {s}) (batch, channels, height, "
                           f"width), got {tuple(images.shape)}")

    def patches(self, images: Tensor) -> Tensor:
        """The embedded patches ``x_pⁱE`` without [CLS] or positions: ``(batch, N, D)``."""
        self.check(images)
        return self.projection(images).flatten(2).transpose(1, 2)  # (b, D, g, g) -> (b, N, D)

    def forward(self, images: Tensor) -> Tensor:
        """``images (batch, C, H, W)`` -> ``z₀ (batch, 1 + N, D)``."""
        x = self.patches(images.to(self.projection.weight.dtype))
        cls = self.cls.expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1) + self.positions
