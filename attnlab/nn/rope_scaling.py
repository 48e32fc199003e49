"""RoPE's frequencies, and the ways of stretching them past the context a model was trained on.

RoPE rotates feature pair i of a query or key at position m by the angle m·θ_i, with

    θ_i = base^(−2i/d)          i = 0 .. d/2 − 1,  d = d_k

A model trained on L positions has seen angles up to L·θ_i only. Each scaling keeps the angles
of a longer context within (or near) what training saw, in its own way (``factor`` s = the
ratio of the new context to the old; L = ``original_max_position_embeddings``):

    linear   θ_i / s                                   every pair slowed alike (Chen et al., 2023)
    dynamic  base' = base · (s·n/L − (s − 1))^(d/(d−2)),  for a sequence of n > L positions,
             none up to L ("dynamic NTK": the base grows with the sequence actually run)
    yarn     θ_i·(1 − γ_i) + (θ_i / s)·γ_i, γ_i a ramp from 0 (pairs that turn more than
             β_fast = 32 times over L: kept) to 1 (fewer than β_slow = 1 time: interpolated);
             and cos, sin × (0.1·ln s + 1), which sharpens the attention (Peng et al., 2023)
    llama3   λ_i = 2π/θ_i; kept when λ_i < L/high_freq_factor, θ_i / s when λ_i > L /
             low_freq_factor, between them a mix: (1 − a)·θ_i/s + a·θ_i with
             a = (L/λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor)

The fields are Hugging Face's ``rope_scaling`` (``rope_parameters``) fields, so a config.json
carries them over as they are, and the numbers are those of transformers' Llama.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def base_frequencies(d_k: int, base: float) -> Tensor:
    """θ_i = base^(−2i/d_k), ``(d_k/2,)`` float64."""
    return base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)


def scaled_frequencies(d_k: int, base: float, scaling: dict[str, Any],
                       seq_len: int | None = None) -> tuple[Tensor, float]:
    """``(θ (d_k/2,) float64, attention factor)`` of a ``rope_scaling`` dict (module docstring).

    ``seq_len``: the positions the current forward spans (only ``dynamic`` reads it). The
    attention factor multiplies cos and sin (1 for every type but yarn).
    """
    kind = scaling.get("rope_type", "default")
    theta = base_frequencies(d_k, base)
    if kind == "default":
        return theta, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return theta / factor, 1.0
    if kind == "dynamic":
        trained = int(scaling["original_max_position_embeddings"])
        n = max(seq_len or trained, trained)
        grown = base * (factor * n / trained - (factor - 1)) ** (d_k / (d_k - 2))
        return base_frequencies(d_k, grown), 1.0
    if kind == "yarn":
        return _yarn(theta, d_k, base, factor, scaling)
    if kind == "llama3":
        return _llama3(theta, factor, scaling), 1.0
    raise ValueError(f"unknown rope_type {kind!r}")


def _yarn(theta: Tensor, d_k: int, base: float, factor: float,
          scaling: dict[str, Any]) -> tuple[Tensor, float]:
    trained = float(scaling["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def pair_turning(rotations: float) -> float:
        """The (fractional) pair index whose angle turns ``rotations`` times over L positions."""
        return d_k * math.log(trained / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = pair_turning(scaling.get("beta_fast") or 32)
    high = pair_turning(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_k - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(d_k // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return theta * (1 - ramp) + (theta / factor) * ramp, float(attention)


def _llama3(theta: Tensor, factor: float, scaling: dict[str, Any]) -> Tensor:
    trained = float(scaling["original_max_position_embeddings"])
    low_f, high_f = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelength = 2 * math.pi / theta
    a = (trained / wavelength - low_f) / (high_f - low_f)
    mixed = (1 - a) * theta / factor + a * theta
    out = torch.where(wavelength > trained / low_f, theta / factor, theta)
    between = (wavelength >= trained / high_f) & (wavelength <= trained / low_f)
    return torch.where(between, mixed, out)
