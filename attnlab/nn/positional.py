"""Positional encodings behind one interface.

Self-attention is permutation-equivariant: without position information a Transformer sees a
bag of tokens. Families inject position in one of three places, so every encoding here
implements the same three hooks and is a no-op in the places it does not use:

* :meth:`PositionalEncoding.embed` — added to the token embeddings (sinusoidal, learned);
* :meth:`PositionalEncoding.rotate` — applied to queries and keys inside attention (RoPE);
* :meth:`PositionalEncoding.attention_bias` — added to the attention scores (ALiBi).

``positions`` are absolute token positions: a ``(seq,)`` tensor shared by the batch or a
``(batch, seq)`` tensor (left-padded batches). :func:`positions_from` builds them from an offset,
so that decoding one token at a time after ``offset`` cached tokens sees exactly the positions
that decoding the whole sequence at once would.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn.rope_scaling import scaled_frequencies


def positions_from(offset: int, length: int, device: torch.device | str | None = None) -> Tensor:
    """Positions ``offset, ..., offset + length - 1`` as a ``(length,)`` long tensor."""
    return torch.arange(offset, offset + length, device=device)


def trailing_keys(q_pos: Tensor, k_len: int) -> Tensor:
    """The positions of ``k_len`` consecutive keys ending at the last query's:
    ``([batch,] k_len)`` for ``q_pos ([batch,] q_len)``."""
    return q_pos[..., -1:] - (k_len - 1) + torch.arange(k_len, device=q_pos.device)


class PositionalEncoding(nn.Module):
    """The interface; the base class is also the ``none`` encoding (every hook is identity)."""

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x (batch, seq, d_model)`` -> ``x + PE(positions)``; identity unless additive."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q (batch, heads, q_len, d_k)`` and ``k (batch, heads_kv, k_len, d_k)``."""
        return q, k

    def attention_bias(self, q_pos: Tensor, k_len: int,
                       k_pos: Tensor | None = None) -> Tensor | None:
        """Additive score bias broadcastable to ``(batch, heads, q_len, k_len)``, or None.

        The ``k_len`` keys are the consecutive positions that end at the last query's position
        (self-attention, with or without a cache: :func:`trailing_keys`), unless ``k_pos
        (k_len,)`` gives them (a static cache: slot j holds position j).
        """
        return None

    def reset_buffers(self) -> None:
        """(Re)compute the buffers that are functions of the constructor's arguments, never
        stored in a checkpoint: after ``to_empty`` on a model built on the ``meta`` device."""

    def _register_tables(self, shapes: dict[str, tuple[int, ...]], make) -> None:
        """Register the float32 tables ``make()`` returns (name -> tensor of ``shapes[name]``)
        as buffers outside checkpoints, on the default device. On the ``meta`` device (a
        model's skeleton) they are shapes only: computing them there would load seconds of
        decompositions, and on the CPU could allocate what a damaged config claims."""
        device = torch.empty(0).device  # (the default device, a `with torch.device` too)
        if device.type == "meta":
            tables = {name: torch.empty(shape, dtype=torch.float32)
                      for name, shape in shapes.items()}
        else:
            with torch.device("cpu"):
                tables = {name: t.to(device) for name, t in make().items()}
        for name, table in tables.items():
            self.register_buffer(name, table, persistent=False)


class NoPositionalEncoding(PositionalEncoding):
    """No position information at all (the model is then permutation-equivariant)."""


def sinusoidal_table(max_len: int, d_model: int, dtype: torch.dtype = torch.float32,
                     split: bool = False) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same): ``(max_len, d)``.

    ``split``: the same features with every sine first and every cosine after them (columns
    ``i`` and ``d/2 + i``), the layout of Marian and fairseq checkpoints.
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    inv_freq = torch.exp(-math.log(10000.0) * two_i / d_model)
    angles = pos * inv_freq
    sin, cos = torch.sin(angles), torch.cos(angles[:, : d_model // 2])
    if split:
        return torch.cat([sin, cos], dim=1).to(dtype)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = sin
    table[:, 1::2] = cos
    return table.to(dtype)


class SinusoidalPositionalEncoding(PositionalEncoding):
    """The paper's fixed encoding (section 3.5), kept in a non-trainable buffer.

    For any fixed offset k, PE(pos + k) is a linear function of PE(pos) (a rotation of each
    (sin, cos) pair by k·ω_i), which the paper gives as the reason for choosing it.
    """

    def __init__(self, d_model: int, max_len: int = 5000, split: bool = False):
        super().__init__()
        self._args = (max_len, d_model, split)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        # persistent=False: a function of (max_len, d_model), so it never goes in a checkpoint.
        max_len, d_model, split = self._args
        self._register_tables({"pe": (max_len, d_model)},
                              lambda: {"pe": sinusoidal_table(max_len, d_model, split=split)})

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if not torch.compiler.is_compiling() and positions.max() >= self.pe.shape[0]:
            raise BadInput(
                f"position {int(positions.max())} exceeds the encoding's max_len "
                f"{self.pe.shape[0]}"
            )
        return x + self.pe[positions].to(x.dtype)


class LearnedPositionalEncoding(PositionalEncoding):
    """A trained table of absolute positions (GPT-2, BERT): ``x + P[pos]``."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if not torch.compiler.is_compiling() and positions.max() >= self.weight.shape[0]:
            raise BadInput(
                f"position {int(positions.max())} exceeds the "
                f"{self.weight.shape[0]} learned positions"
            )
        return x + self.weight[positions]


class RotaryPositionalEncoding(PositionalEncoding):
    """RoPE (Su et al., 2021): rotate each pair of query/key features by angle pos·θ_i.

    θ_i = base^(-2i/d_k). Pairs are (x_i, x_{i + d_k/2}) (the "rotate half" layout used by
    GPT-NeoX and Llama checkpoints). Because rotations compose, q_m·k_n depends on m − n only.
    ``scaling`` stretches θ for contexts longer than training (:mod:`attnlab.nn.rope_scaling`:
    linear, dynamic, yarn, llama3). Every type but ``dynamic`` gives fixed angles, tabulated
    once for ``max_len`` positions; dynamic NTK's θ depends on the longest position of each
    forward, so its angles are computed per call from the positions given.
    """

    def __init__(self, d_k: int, max_len: int = 4096, base: float = 10000.0,
                 scaling: dict[str, Any] | None = None):
        super().__init__()
        if d_k % 2:
            raise BadInput(f"RoPE needs an even head dimension, got d_k={d_k}")
        self._args = (d_k, max_len, base, dict(scaling or {}))
        self.dynamic = self._args[3].get("rope_type") == "dynamic"
        self._dynamic_table: tuple[Tensor, Tensor, Tensor] | None = None
        self.reset_buffers()

    def reset_buffers(self) -> None:
        d_k, max_len = self._args[:2]
        rows = 1 if self.dynamic else max_len

        def tables():
            cos, sin = self._table(torch.arange(rows), None)
            return {"cos": cos, "sin": sin}

        self._register_tables({"cos": (rows, d_k), "sin": (rows, d_k)}, tables)

    def _table(self, positions: Tensor, seq_len: int | None) -> tuple[Tensor, Tensor]:
        """cos and sin of pos·θ_i (times yarn's attention factor): ``(..., d_k)`` float32.

        The fixed tables are made once, in float64 (then rounded); dynamic NTK's, made per
        call, in float32 as transformers makes them (and as every device can)."""
        d_k, _, base, scaling = self._args
        theta, factor = scaled_frequencies(d_k, base, scaling, seq_len)
        dtype = torch.float32 if self.dynamic else torch.float64
        angles = positions.to(dtype)[..., None] * theta.to(positions.device, dtype)
        angles = torch.cat([angles, angles], dim=-1)
        return (angles.cos() * factor).float(), (angles.sin() * factor).float()

    def _rotate_one(self, x: Tensor, positions: Tensor) -> Tensor:
        if self.dynamic:
            # every layer's q and k rotate by the same positions tensor in one forward pass:
            # its table is made once (a held reference, so identity cannot be reused)
            if self._dynamic_table is None or self._dynamic_table[0] is not positions:
                self._dynamic_table = (positions,
                                       *self._table(positions, int(positions.max()) + 1))
            cos, sin = (t.to(x.dtype) for t in self._dynamic_table[1:])
        else:
            if not torch.compiler.is_compiling() and positions.max() >= self.cos.shape[0]:
                raise BadInput(
                    f"position {int(positions.max())} exceeds RoPE max_len {self.cos.shape[0]}"
                )
            cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        if positions.dim() == 2:  # (batch, seq, d_k) -> (batch, 1, seq, d_k)
            cos, sin = cos[:, None], sin[:, None]
        half = x.shape[-1] // 2
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated_half * sin

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return self._rotate_one(q, q_pos), self._rotate_one(k, k_pos)


def alibi_slopes(n_heads: int) -> Tensor:
    """The ALiBi paper's head slopes: a geometric sequence starting at 2^(-8/n).

    For a head count that is not a power of two, take the slopes of the next lower power of two
    and fill up with every other slope of the next higher one (as the paper's code does).
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    lower = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(power_of_two(lower) + extra)


class ALiBiPositionalEncoding(PositionalEncoding):
    """ALiBi (Press et al., 2022): no embedding; score bias −m_h·|i − j| for head h."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.reset_buffers()

    def reset_buffers(self) -> None:
        self._register_tables({"slopes": (self.n_heads,)},
                              lambda: {"slopes": alibi_slopes(self.n_heads)})

    def attention_bias(self, q_pos: Tensor, k_len: int, k_pos: Tensor | None = None) -> Tensor:
        k_pos = trailing_keys(q_pos, k_len) if k_pos is None else k_pos
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).abs().float()  # ([b,] q, k)
        if distance.dim() == 2:
            distance = distance[None]
        return -self.slopes[None, :, None, None] * distance[:, None]


def build_positional(kind: str, d_model: int, n_heads: int, max_len: int, rope_base: float,
                     rope_scaling: dict[str, Any] | None = None, d_k: int | None = None):
    """One constructor for every kind: sinusoidal (or sinusoidal-split: the sines first, then
    the cosines), learned, rope (``rope_scaling``: HF's dict; ``d_k``: the head width when it
    is not d_model / n_heads), alibi, none."""
    if kind in ("sinusoidal", "sinusoidal-split"):
        return SinusoidalPositionalEncoding(d_model, max_len, split=kind == "sinusoidal-split")
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len)
    if kind == "rope":
        return RotaryPositionalEncoding(d_k or d_model // n_heads, max_len, rope_base,
                                        rope_scaling)
    if kind == "alibi":
        return ALiBiPositionalEncoding(n_heads)
    if kind == "none":
        return NoPositionalEncoding()
    raise BadInput(f"unknown positional encoding {kind!r}")
