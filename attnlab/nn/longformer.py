"""Longformer attention (Beltagy et al., 2020): a sliding window, plus a few global tokens.

With a window W = ``attention_window`` (even), one side w = W/2, the real (non-padding) tokens
R and the global tokens G ⊆ R of a row:

    local query i ∉ G:   keys  B(i) ∪ G,   B(i) = {j ∈ R \\ G : |i − j| ≤ w}
                         out_i = softmax_j(q_i·k_j/√d_k) v_j       q, k, v = x W_Q, x W_K, x W_V
    global query i ∈ G:  keys  R (every token)
                         out_i = softmax_j(q'_i·k'_j/√d_k) v'_j    the same with W_Q', W_K', W_V'

so every token reads the global ones (the [CLS] of a classifier, the question in QA) with the
ordinary projections, and the global ones read everything through projections of their own
(``q_global``, ``k_global``, ``v_global``). A global key is reached through G, never through
the band, so it is counted once. Padding queries output zeros (transformers' convention).

The band is never an n × n matrix. The sequence is padded to a multiple of W (masked keys; the
output is cut back), its queries cut into blocks of w, and block c (queries cw … cw + w − 1)
attends the 3w keys from (c − 1)w to (c + 2)w − 1 that hold all of its bands, plus the global
keys: ordinary masked attention (:func:`attnlab.nn.scaled_dot_product_attention`) with

    queries (batch·n/w, heads, w, d_k),  keys (batch·n/w, heads, 3w + |G|, d_k),
    mask    (batch·n/w, 1, w, 3w + |G|): |i − j| ≤ w, j ∈ R \\ G in the window; j ∈ G after it

so the scores hold n·(3w + |G|) numbers a head instead of n²: memory O(n·w), linear in n. The
global queries add |G|·n. (transformers packs the band as (n, 2w + 1) diagonals; the blocks
here spend 3w a row for plain matrix products over strided windows.)

Shapes: ``x (batch, n, d_model)``; :class:`LongformerMask` holds ``real`` and ``global_``,
both boolean ``(batch, n)``; the output is ``(batch, n, d_model)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.multihead import MultiHeadAttention


@dataclass(frozen=True)
class LongformerMask:
    """What a Longformer layer may attend: ``real (batch, n)`` True at tokens, False at padding
    (True = may attend, as every mask); ``global_ (batch, n)`` True at the global tokens. An
    encoder passes it down as its layers' ``mask``."""

    real: Tensor
    global_: Tensor

    @classmethod
    def of(cls, ids: Tensor, attention_mask: Tensor | None,
           global_attention_mask: Tensor | None) -> LongformerMask:
        """From the model's inputs: ``ids (batch, n)``, the 1/0 or boolean masks or None (no
        padding; no global token). A padding position is never global."""
        real = (torch.ones_like(ids, dtype=torch.bool) if attention_mask is None
                else attention_mask.bool())
        glob = (torch.zeros_like(real) if global_attention_mask is None
                else global_attention_mask.bool() & real)
        return cls(real, glob)


def global_slots(global_: Tensor) -> tuple[Tensor, Tensor]:
    """``global_ (batch, n)`` -> ``index (batch, G)``, the positions of each row's global
    tokens in order (G: the most in a row), and ``valid (batch, G)``, False at the slots of
    rows with fewer. A slot that is not valid points at a position that is not global."""
    count = global_.sum(1)
    n_slots = int(count.max()) if global_.numel() else 0
    index = torch.argsort((~global_).to(torch.uint8), dim=1, stable=True)[:, :n_slots]
    valid = torch.arange(n_slots, device=global_.device)[None] < count[:, None]
    return index, valid


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """``x (batch, heads, n, d)``, ``index (batch, G)`` -> ``(batch, heads, G, d)``."""
    b, h, _, d = x.shape
    return x.gather(2, index[:, None, :, None].expand(b, h, index.shape[1], d))


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, window: int,
                             k_extra: Tensor | None = None, v_extra: Tensor | None = None,
                             extra: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """Each query ``i`` attends the keys ``j`` with ``|i − j| ≤ window/2`` where ``keys`` is
    True, and every extra key where ``extra`` is True, in one softmax (the module docstring's
    blocks).

    Args:
        q, k, v: ``(batch, heads, n, d_k)``.
        keys: ``(batch, n)`` boolean, the keys the band may use.
        window: W, even: W/2 keys each side.
        k_extra, v_extra: ``(batch, heads, G, d_k)``, keys every query reads (global tokens).
        extra: ``(batch, G)`` boolean, which of them exist.

    Returns:
        ``(batch, heads, n, d_k)``; a query with no key to attend gets zeros.
    """
    b, h, n, d = q.shape
    w = window // 2
    n_pad = -n % window  # as transformers: a multiple of the whole window
    blocks = (n + n_pad) // w
    # queries in blocks of w: (batch·blocks, heads, w, d)
    qb = F.pad(q, (0, 0, 0, n_pad)).view(b, h, blocks, w, d).transpose(1, 2)
    qb = qb.reshape(b * blocks, h, w, d)

    def windows(x: Tensor) -> Tensor:
        """The 3w keys around each block: a strided view, (batch, blocks, heads, 3w, d)."""
        padded = F.pad(x, (0, 0, w, w + n_pad))
        return padded.unfold(2, 3 * w, w).permute(0, 2, 1, 4, 3)

    kb, vb = windows(k), windows(v)
    key_ok = F.pad(keys, (w, w + n_pad), value=False).unfold(1, 3 * w, w)  # (b, blocks, 3w)
    # query r of a block sits at window index w + r; its band is window indices r … r + 2w
    r, c = torch.arange(w, device=q.device), torch.arange(3 * w, device=q.device)
    band = (c[None, :] - r[:, None] - w).abs() <= w  # (w, 3w)
    mask = band & key_ok[:, :, None, :]  # (b, blocks, w, 3w)
    if k_extra is not None and k_extra.shape[2]:
        g = k_extra.shape[2]
        kb = torch.cat([kb, k_extra[:, None].expand(b, blocks, h, g, d)], dim=3)
        vb = torch.cat([vb, v_extra[:, None].expand(b, blocks, h, g, d)], dim=3)
        mask = torch.cat([mask, extra[:, None, None, :].expand(b, blocks, w, g)], dim=3)
    kb, vb = kb.reshape(b * blocks, h, -1, d), vb.reshape(b * blocks, h, -1, d)
    out = scaled_dot_product_attention(qb, kb, vb, mask=mask.reshape(b * blocks, 1, w, -1),
                                       dropout_p=dropout_p)
    out = out.view(b, blocks, h, w, d).transpose(1, 2).reshape(b, h, blocks * w, d)
    return out[:, :, :n]


class LongformerSelfAttention(MultiHeadAttention):
    """Multi-head self-attention over a band of ``window`` tokens and the global tokens, with
    the global tokens' own projections (module docstring). Its ``mask`` is a
    :class:`LongformerMask`; positional encodings must be added to the embeddings (learned
    or sinusoidal), as the layer applies no rotation and no score bias."""

    def __init__(self, d_model: int, n_heads: int, window: int, bias: bool = True,
                 dropout: float = 0.0):
        super().__init__(d_model, n_heads, bias=bias, dropout=dropout)
        if window < 2 or window % 2:
            raise BadInput(f"attention_window must be even and positive, got {window}")
        self.window = window
        self.q_global = nn.Linear(d_model, self.q_dim, bias=bias)
        self.k_global = nn.Linear(d_model, self.q_dim, bias=bias)
        self.v_global = nn.Linear(d_model, self.q_dim, bias=bias)

    def forward(self, x: Tensor, mask: LongformerMask | None = None, need_weights: bool = False,
                packing: object = None, **_: object) -> Tensor:
        """``x (batch, n, d_model)`` -> ``(batch, n, d_model)``. The encoder's other keywords
        (positions, a score bias, a cache) do not apply to an encoder's banded layer."""
        if need_weights:
            raise BadInput("a Longformer layer has no n × n attention weights to return "
                           "(its band is computed in blocks)")
        if packing is not None:
            raise ValueError("a Longformer layer runs on the padded layout, not packed")
        if not isinstance(mask, LongformerMask):
            mask = LongformerMask.of(x[..., 0], None, None)
        h, p = self.n_heads, self.dropout if self.training else 0.0
        q, k, v = (self._heads(t, h) for t in self._project(x, None, need_kv=True))
        index, valid = global_slots(mask.global_)
        out = sliding_window_attention(q, k, v, mask.real & ~mask.global_, self.window,
                                       _gather(k, index), _gather(v, index), valid, p)
        if index.shape[1]:  # the global queries read every real token, their own projections
            xg = x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))
            out_g = scaled_dot_product_attention(
                self._heads(self.q_global(xg), h), self._heads(self.k_global(x), h),
                self._heads(self.v_global(x), h), mask=mask.real[:, None, None, :], dropout_p=p)
            placed = out.scatter(2, index[:, None, :, None].expand_as(out_g), out_g)
            out = torch.where(mask.global_[:, None, :, None], placed, out)
        out = out.masked_fill(~mask.real[:, None, :, None], 0.0)  # padding queries: zeros
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, self.q_dim))
