"""Preparing an encoder for inference on a CPU: its matrices packed once for oneDNN.

An encoder's forward pass (BERT, MiniLM: ``embed``, ``classify``, ``ner``, ``qa``) is matrix
products over every token of a batch, ``x (tokens, in) · Wᵀ``, bound by arithmetic, not by the
bytes of ``W`` as decoding is. PyTorch's ``nn.Linear`` hands ``W`` to the BLAS at every call,
which lays it out in the blocks its inner loop reads, each time. Packing ``W`` once in oneDNN's
own blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and multiplying with
``_linear_pointwise`` skips that, and oneDNN's kernels run nearer the CPU's peak on the shapes
of a sentence encoder (docs/benchmarks.md, "Encoders against onnxruntime").

    y = x · Wᵀ + b          the same product; only where ``W`` is kept and who multiplies

:func:`for_encoding` swaps :class:`PackedLinear` in for the linears of a model from beside it,
as :func:`~attnlab.cpu.prepare.for_decoding` swaps in the decoding kernels, and BERT's
feed-forward for :class:`PackedFeedForward`, whose GELU oneDNN applies inside ``W₁``'s product.
In ``bf16`` the packed matrices are bf16 and each product rounds its input to bf16, sums in
float32 and rounds its result to bf16 (as autocast's linear does), returned as float32: the
norms, softmax, attention and the residual stream stay float32, without casting every weight
at every call.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.hardware import DTYPES
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.quantized import integer_parts

PRECISIONS = ("fp32", "bf16")  # what the packed products run in
_WORKS: dict[torch.dtype, bool] = {}  # whether oneDNN's packed product runs here, per dtype


def packed_products(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this PyTorch packs and multiplies linears with oneDNN here in ``dtype``: built
    with it, the ops present, the CPU able (bf16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT on
    x86), and a small product equal to ``nn.Linear``'s. Asked once per dtype; where it is not,
    encoders keep ``nn.Linear`` (under autocast for bf16), with one warning."""
    if dtype not in _WORKS:
        why = None
        if not torch.backends.mkldnn.is_available():
            why = "this PyTorch has no oneDNN"
        else:
            try:
                w, x = torch.randn(24, 40).to(dtype), torch.randn(3, 40).to(dtype)
                packed = torch.ops.mkldnn._reorder_linear_weight(w, 3)
                y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                want = x.float() @ w.float().t()
                if not torch.allclose(y.float(), want, atol=0.05, rtol=0.01):
                    why = "its product differs from nn.Linear's"
            except (RuntimeError, AttributeError) as error:
                why = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        _WORKS[dtype] = why is None
        if why is not None:
            name = str(dtype).removeprefix("torch.")
            warnings.warn(f"oneDNN's packed {name} matrix product is not available here ({why});"
                          f" encoders run nn.Linear's product", RuntimeWarning, stacklevel=2)
    return _WORKS[dtype]


class PackedLinear(nn.Linear):
    """``nn.Linear`` whose inference products on a CPU run oneDNN on ``W`` packed once, in
    ``packed_dtype`` (float32, or bf16 with ``x`` rounded to it and ``y`` rounded to it once,
    then returned float32).
    ``weight`` and ``bias`` stay the float parameters they were (saving, adapters, training
    read them); a gradient to pass, autocast, another device or a dtype of ``x`` other than
    float32 is ``nn.Linear``'s own product. A weight or bias changed since it was packed (in
    place, by an optimizer's step or ``load_state_dict``, or replaced through ``.data`` or a
    cast) is packed again at the next product."""

    packed: Tensor
    packed_bias: Tensor | None
    packed_dtype: torch.dtype

    def pack(self, dtype: torch.dtype, rows_hint: int = 128) -> PackedLinear:
        """Pack ``W`` (and the bias) in ``dtype``; ``rows_hint``: the rows a product usually
        has, which oneDNN may choose its layout by (any count works)."""
        w = self.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype).contiguous(),
                                                              rows_hint)
        self.packed_bias = None if self.bias is None else self.bias.detach().to(dtype).clone()
        self.packed_dtype = dtype
        self._packed_of = self._source()
        return self

    def _source(self) -> tuple:
        """What the packed copies were made from: each parameter's storage and version (an
        in-place change bumps the version; ``.data = …`` or a cast changes the storage)."""
        return tuple((t.data_ptr(), t._version, t.dtype) if t is not None else None
                     for t in (self.weight, self.bias))

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed matrix out (oneDNN's layout has no storage to
        copy); the copy packs its own at its first product."""
        state = self.__dict__.copy()
        state["packed"], state["packed_bias"], state["_packed_of"] = None, None, None
        return state

    def forward(self, x: Tensor) -> Tensor:
        return self.product(x) if self._packed_applies(x) else super().forward(x)

    def product(self, x: Tensor, then: str = "none", form: str = "",
                keep: bool = False) -> Tensor:
        """oneDNN's product on the packed ``W``, ``x`` float32 or already ``packed_dtype``;
        ``then``/``form``: a function it applies to the result in the same pass (``"gelu",
        "none"``: the exact erf GELU); ``keep``: return the result in ``packed_dtype`` (for
        another packed product to read) rather than float32."""
        if self.packed is None or self._packed_of != self._source():  # changed since
            self.pack(self.packed_dtype)
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.packed_dtype), self.packed,
                                               self.packed_bias, then, [], form)
        return y if keep else y.float()

    def needs_grad(self, x: Tensor) -> bool:
        """Whether a product of ``x`` has a gradient to pass (then it is nn.Linear's)."""
        return torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in self.parameters()))

    def _packed_applies(self, x: Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == torch.float32 and not self.needs_grad(x)
                and not torch.is_autocast_enabled("cpu") and x.shape[-1] == self.in_features
                and x.numel() > 0)


class PackedFeedForward(FeedForward):
    """BERT's feed-forward, ``W₂ · GELU(W₁ x + b₁) + b₂``, with the GELU applied by oneDNN
    inside ``W₁``'s product (one pass over the ``(tokens, d_ff)`` hidden layer fewer), and that
    layer kept in the packed dtype for ``W₂`` (in bf16, two conversions of it fewer), where
    both are packed, the model is in eval mode and neither has a gradient to pass; otherwise
    :class:`FeedForward`'s own forward."""

    def forward(self, x: Tensor) -> Tensor:
        if (not self.training and isinstance(self.w1, PackedLinear)
                and self.w1._packed_applies(x) and isinstance(self.w2, PackedLinear)
                and self.w1.packed_dtype == self.w2.packed_dtype
                and not self.w2.needs_grad(x)):
            # the hidden layer stays in the packed dtype between the two products (dropout is
            # the identity at inference, where the packed product applies)
            return self.w2.product(self.w1.product(x, "gelu", "none", keep=True))
        return super().forward(x)


def for_encoding(model: nn.Module, precision: str = "fp32") -> bool:
    """Pack the float linears of a CPU ``model`` for inference (:class:`PackedLinear`), their
    products in ``precision`` ("fp32" or "bf16"); returns whether it did. Nothing changes where
    the model is not on a CPU, oneDNN cannot run ``precision`` here (one warning; bf16 needs
    AVX-512 or AVX-NE-CONVERT: an AVX2 CPU keeps autocast's bf16) or the model holds integer
    layers (a quantised folder keeps its own kernels). Only plain float32 ``nn.Linear`` layers
    are packed (a LoRA adapter's A and B are, and its sum is unchanged). The model's
    parameters, names and ``state_dict`` are untouched; the packed copies cost the memory of
    the matrices again (half of it in bf16); a copy or pickle of the model packs its own."""
    if precision not in PRECISIONS:
        raise BadInput(f"an encoder's packed products run in {' or '.join(PRECISIONS)}, "
                       f"not {precision!r}")
    first = next(model.parameters(), None)
    if (first is None or first.device.type != "cpu" or integer_parts(model) is not None
            or not packed_products(DTYPES[precision])):
        return False
    linears = [m for m in model.modules()
               if type(m) is nn.Linear and m.weight.dtype == torch.float32]
    for layer in linears:
        layer.__class__ = PackedLinear
        layer.pack(DTYPES[precision])
    for block in model.modules():  # the exact GELU, ungated: fused into W₁'s product
        if (type(block) is FeedForward and block.activation == "gelu" and block.w3 is None
                and block.w13 is None and isinstance(block.w1, PackedLinear)):
            block.__class__ = PackedFeedForward
    return bool(linears)


__all__ = ["PRECISIONS", "PackedFeedForward", "PackedLinear", "for_encoding", "packed_products"]
