"""Activation checkpointing: recompute activations in backward instead of keeping them.

Training keeps, for backward, every activation a layer computes. A checkpointed piece keeps only
its input and runs its forward again during backward (non-reentrant ``torch.utils.checkpoint``):

* ``block``: each layer is a piece. Memory ≈ N·(a layer's input) + one layer's inside, a
  constant factor below keeping all N insides; time ≈ (1 + α) × standard, α ≈ 0.2–0.3 (one more
  forward, about a third of forward + backward).
* ``sqrt``: segments of ⌈√N⌉ consecutive layers are the pieces, keeping √N inputs and one
  segment's inside: the course's memory ∝ √N instead of N (it pays off when a layer's inputs,
  not its inside, dominate: benchmarks/parallel.py measures both).

It is applied from outside the model: the layers' ``forward`` is wrapped on the instance, so
names, weights and state dicts are untouched, and gradients equal those without it (the same
ops run again, with the RNG state of the first run).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

MODES = ("none", "block", "sqrt")

def layer_stacks(model: nn.Module) -> list[nn.ModuleList]:
    """Every stack's list of layers (the encoder's, the decoder's, a GPT's blocks)."""
    return [m.layers for m in model.modules()
            if isinstance(getattr(m, "layers", None), nn.ModuleList)]


def apply_checkpointing(model: nn.Module, mode: str) -> None:
    """Recompute activations in backward instead of keeping them (non-reentrant
    ``torch.utils.checkpoint``), per ``mode``:

    * ``block``: each layer keeps only its input; memory ≈ N·(input) + one layer's inside.
    * ``sqrt``: segments of ⌈√N⌉ consecutive layers are one checkpoint each, keeping ≈ √N
      inputs and one segment's inside: the course's memory / √N scheme.

    The layers' ``forward`` is wrapped on the instance; names, weights and state dicts are
    untouched. Gradients equal those without checkpointing (the same ops run again)."""
    if mode == "none":
        return
    for layers in layer_stacks(model):
        unique = list(dict.fromkeys(layers))  # ALBERT: one layer object N times
        if mode == "block" or len(unique) < len(layers):
            for layer in unique:
                _checkpoint_layer(layer)
            continue
        size = math.ceil(math.sqrt(len(layers)))
        for start in range(0, len(layers), size):
            _Segment(list(layers[start:start + size]))


def _checkpoint_layer(layer: nn.Module) -> None:
    inner = layer.forward

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():  # inference: nothing to keep, nothing to recompute
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    layer.forward = forward


class _Segment:
    """Layers ``[a, b)`` of a stack run as one checkpoint. The stack still calls each layer
    with ``(x, *same arguments)``: the first runs the whole segment under ``checkpoint``, the
    others pass ``x`` through, except while the segment itself runs them."""

    def __init__(self, layers: list[nn.Module]):
        self.layers, self.running = layers, False
        self.inner = [layer.forward for layer in layers]
        layers[0].forward = self.first
        for i, layer in enumerate(layers[1:], start=1):
            layer.forward = self.later(i)

    def run(self, x: Tensor, *args) -> Tensor:
        self.running = True
        try:
            for layer in self.layers:
                x = layer(x, *args)
        finally:
            self.running = False
        return x

    def first(self, x: Tensor, *args) -> Tensor:
        if self.running or not torch.is_grad_enabled():  # inside the segment, or inference
            return self.inner[0](x, *args)
        return checkpoint(self.run, x, *args, use_reentrant=False)

    def later(self, i: int):
        def forward(x: Tensor, *args) -> Tensor:
            # without gradients (validation, decoding with a KV cache after training) every
            # layer runs as it always does, each with its own arguments
            if self.running or not torch.is_grad_enabled():
                return self.inner[i](x, *args)
            return x  # the segment's first layer has run this one already
        return forward


__all__ = ["MODES", "apply_checkpointing", "layer_stacks"]
