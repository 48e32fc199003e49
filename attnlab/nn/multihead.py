"""Multi-head attention (paper section 3.2.2).

    MultiHead(X, C) = Concat(head₁, …, head_h) · W_O
    head_i          = Attention(X·W_Q^i, C·W_K^i, C·W_V^i)

``X (batch, q_len, d_model)`` gives the queries; ``C`` gives keys and values: ``C = X`` for
self-attention, the encoder output ``(batch, k_len, d_model)`` for cross-attention. Each head
works in ``d_k = d_model / h`` dimensions, so h heads cost about as much as one full-width head
(T5 v1.1 chooses d_k apart: ``h·d_k ≠ d_model``, ``head_dim``).

Grouped-query attention (Ainslie et al., 2023): with ``num_kv_heads < n_heads`` each key/value
head is shared by ``n_heads / num_kv_heads`` query heads (``num_kv_heads = 1`` is multi-query
attention), shrinking the KV cache by that factor.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.cache import KVCache
from attnlab.nn.packing import Packing
from attnlab.nn.positional import PositionalEncoding


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with h heads; see the module docstring for the formula.

    Args:
        d_model: model width.
        n_heads: number of query heads h.
        num_kv_heads: key/value heads (defaults to ``n_heads``; must divide it).
        bias: bias on the Q/K/V and output projections.
        qkv_bias: bias on Q/K/V alone, when it differs from ``bias`` (a ViT without
            them, Qwen2 with them only); None: ``bias``.
        fused_qkv: one ``(d_model → (h + 2·h_kv)·d_k)`` projection instead of three; self-attention
            then runs a single matmul (cross-attention slices the same weight).
        dropout: dropout on the attention weights.
        head_dim: d_k, when it is not ``d_model / n_heads`` (a layer whose heads were pruned
            keeps its heads' width: ``h·d_k < d_model``; T5 v1.1 sets it freely).
        scale: the factor on the scores Q·Kᵀ; None: 1/√d_k (T5: 1.0).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = True,
        fused_qkv: bool = False,
        dropout: float = 0.0,
        head_dim: int | None = None,
        scale: float | None = None,
        qkv_bias: bool | None = None,
    ):
        super().__init__()
        num_kv_heads = n_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None and d_model % n_heads:
            raise BadInput(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % num_kv_heads:
            raise BadInput(f"n_heads={n_heads} is not divisible by num_kv_heads={num_kv_heads}")
        self.n_heads, self.num_kv_heads = n_heads, num_kv_heads
        self.d_k = d_model // n_heads if head_dim is None else head_dim
        self.q_dim, self.kv_dim = n_heads * self.d_k, num_kv_heads * self.d_k
        self.dropout = dropout
        self.scale = scale
        self.original_heads = list(range(n_heads))  # after pruning: the index each had before
        qkv_bias = bias if qkv_bias is None else qkv_bias
        if fused_qkv:
            self.qkv = nn.Linear(d_model, self.q_dim + 2 * self.kv_dim, bias=qkv_bias)
        else:
            self.q_proj = nn.Linear(d_model, self.q_dim, bias=qkv_bias)
            self.k_proj = nn.Linear(d_model, self.kv_dim, bias=qkv_bias)
            self.v_proj = nn.Linear(d_model, self.kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(self.q_dim, d_model, bias=bias)
        self.fused_qkv = fused_qkv

    def unfuse_qkv_(self) -> None:
        """Split a fused ``qkv`` projection into ``q_proj``, ``k_proj`` and ``v_proj`` holding
        the same rows (``[Q | K | V]``), in place. Tensor parallelism shards each of the three
        by heads; sharding the fused matrix by rows would hand a rank Q's rows and part of K's."""
        if not self.fused_qkv:
            return
        weight, bias = self.qkv.weight.detach(), self.qkv.bias
        sizes = [self.q_dim, self.kv_dim, self.kv_dim]
        rows = weight.split(sizes)
        biases = bias.detach().split(sizes) if bias is not None else [None] * 3
        for name, w, b in zip(("q_proj", "k_proj", "v_proj"), rows, biases, strict=True):
            linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None,
                               device=w.device, dtype=w.dtype)
            linear.weight = nn.Parameter(w.clone(), requires_grad=self.qkv.weight.requires_grad)
            if b is not None:
                linear.bias = nn.Parameter(b.clone(), requires_grad=bias.requires_grad)
            setattr(self, name, linear)
        del self.qkv
        self.fused_qkv = False

    def fuse_qkv_(self, qkv: nn.Module) -> None:
        """The inverse of :meth:`unfuse_qkv_`: ``qkv`` computes ``[Q | K | V]`` (for example
        :func:`attnlab.cpu.linear.stack_rows` of the three), in place of the three
        projections, so that self-attention runs one product."""
        if self.fused_qkv:
            return
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv, self.fused_qkv = qkv, True

    def _heads(self, x: Tensor, n: int) -> Tensor:
        """``(batch, seq, n·d_k) -> (batch, n, seq, d_k)``."""
        b, s, _ = x.shape
        return x.view(b, s, n, self.d_k).transpose(1, 2)

    def _project(self, x: Tensor, context: Tensor | None, need_kv: bool):
        """Q from ``x``; K, V from ``context`` (or ``x``), unless ``need_kv`` is False."""
        if not self.fused_qkv:
            src = x if context is None else context
            q = self.q_proj(x)
            if not need_kv:
                return q, None, None
            return q, self.k_proj(src), self.v_proj(src)
        if context is None and need_kv:
            return self.qkv(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x, w[: self.q_dim], None if b is None else b[: self.q_dim])
        if not need_kv:
            return q, None, None
        src = x if context is None else context
        kv = F.linear(src, w[self.q_dim :], None if b is None else b[self.q_dim :])
        k, v = kv.split([self.kv_dim, self.kv_dim], dim=-1)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor | tuple[Tensor, Tensor]:
        """Attention(Q, K, V) of the heads: :func:`scaled_dot_product_attention` (a decoding
        engine may compute the same equation its own way from beside the model:
        :class:`attnlab.cpu.attention.DecodeAttention`)."""
        return scaled_dot_product_attention(q, k, v, **kwargs)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positional: PositionalEncoding | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
        packing: Packing | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x (batch, q_len, d_model)`` to ``context`` (or to ``x`` itself).

        Args:
            mask: boolean, True = may attend, broadcastable to ``(batch, heads, q_len, k_len)``
                where ``k_len`` counts cached positions too.
            is_causal: causal self-attention (bottom-right aligned when keys are cached).
            positional: the model's positional encoding; self-attention applies its rotation
                (RoPE), and its score bias unless ``bias`` is given. Cross-attention uses
                neither.
            positions: absolute positions of the queries, ``(q_len,)`` or ``(batch, q_len)``.
            cache: self-attention appends the new keys/values; a static (cross-attention)
                cache is filled on first use and reused after.
            need_weights: also return the weights ``(batch, heads, q_len, k_len)``.
            bias: the positions' additive score bias (ALiBi, T5's relative bias),
                broadcastable to ``(batch, heads, q_len, k_len)``. A stack computes it once
                (``positional.attention_bias``) and every layer adds the same one; without
                it, self-attention asks ``positional`` itself.
            packing: ``x`` is packed, ``(n_real, d_model)`` (:mod:`attnlab.nn.packing`):
                the projections run on real tokens only; self-attention without a cache.

        Returns:
            ``(batch, q_len, d_model)``, or ``(output, weights)`` when ``need_weights``.
        """
        reuse = cache is not None and cache.static and cache.filled
        q, k, v = self._project(x, context, need_kv=not reuse)
        if packing is not None:  # projected on the real tokens; attention needs the layout
            q, k, v = packing.unpack(q), packing.unpack(k), packing.unpack(v)
        q = self._heads(q, self.n_heads)
        if not reuse:
            k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if context is None and positional is not None:
            if positions is None:
                raise ValueError("positions are required with a positional encoding")
            q, k = positional.rotate(q, k, positions, positions)
        if reuse:
            k, v = cache.k, cache.v
        elif cache is not None:
            k, v = cache.append(k, v)
        if bias is None and context is None and positional is not None:
            bias = positional.attention_bias(positions, k.shape[2])  # used alone, not in a stack
        if bias is not None and bias.shape[1] > 1 and bias.shape[1] != self.n_heads:
            bias = bias[:, self.original_heads]  # pruned: the bias rows of the heads left
        result = self.attend(
            q, k, v, mask=mask, bias=bias, is_causal=is_causal, need_weights=need_weights,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
        )
        out, weights = result if need_weights else (result, None)
        b, _, s, _ = out.shape
        out = out.transpose(1, 2).reshape(b, s, self.q_dim)
        if packing is not None:
            out = packing.pack(out)
        out = self.out_proj(out)
        return (out, weights) if need_weights else out

