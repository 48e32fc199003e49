"""Integer weight-only linear layers: a matrix read at 8, 4 or 2 bits per weight instead of 32.

Generating one token reads every weight matrix once, so on a CPU a small model's decoding
speed is set by how many bytes its weights take. Two codes, both ``y = x · Ŵᵀ (+ b)`` with the
dequantised ``Ŵ`` never materialised:

* **int8, per output channel** (symmetric, no zero point)::

      Ŵ[o, i] = s[o] · q[o, i],   q ∈ {−127, …, 127},   s[o] = max_i |W[o, i]| / 127

  so ``|W − Ŵ| ≤ s[o] / 2``. For a few rows (decoding) PyTorch's ``_weight_int8pack_mm`` in
  bfloat16 (attnlab's own kernel, float32 activations, where :mod:`attnlab.cpu` is applied),
  a GEMM on ``Ŵ`` in :func:`float_dtype` for many; or,
  with ``activations="dynamic"``, in
  float32 through the quantised-engine GEMM
  ``quantized::linear_dynamic`` (fbgemm or oneDNN on x86, QNNPACK on ARM): each call
  quantises ``x`` to 8 bits with its own range and multiplies int8 by int8, which is where
  VNNI/AMX CPUs are fast. An x86 CPU without VNNI adds pairs of u8 · s8 products in int16
  with saturation (``vpmaddubsw``): there ``x`` gets 7 bits (``reduce_range``), so that
  2 · 127 · 127 < 2^15 and no sum is clipped.
* **int4 and int2, group-wise** over ``g`` consecutive inputs of a row (llama.cpp's Q4_1 at
  4 bits and g = 32)::

      Ŵ[o, i] = s[o, i // g] · (c[o, i] − 8) + z[o, i // g],   c ∈ {0, …, 2^bits − 1}

  with ``s = (max − min) / (2^bits − 1)`` and ``z = min + 8·s`` (the value of code 8) per
  group, both kept in bfloat16, so ``|W − Ŵ| ≤ s / 2`` plus their bf16 rounding,
  ``2⁻⁸ · (|z| + 8·s)``. For a few rows PyTorch's int4 kernel with bfloat16 activations;
  where :mod:`attnlab.cpu` is applied, attnlab's own kernel unpacks the codes on the fly
  against ``x`` rounded to 16 bits per 32 inputs (:mod:`attnlab.cpu.kernels` states the
  bound), reading ``s`` and ``b = z − 8s`` in float16 (``b`` rounded once more, by at most
  ``2⁻¹¹ · |b|``; a scale below float16's normal range, 6·10⁻⁵, keeps fewer bits). Many rows
  (a prompt) run a GEMM on ``Ŵ`` in :func:`float_dtype`. 2-bit codes are stored at 2 bits on
  disk and run through the 4-bit kernel (4 bits in memory), the same speed as int4.

The kernels are CPU ones, so the layers run on the CPU and say so otherwise. On disk
(``state_dict``) a layer is portable: ``qweight`` (int8 ``(out, in)``, or uint8 codes packed
little-end first, ``8 / bits`` a byte, ``(out, in · bits / 8)``), ``scales`` and, for the
group-wise codes, ``zeros``. In memory the 4-bit codes stay in that packing (two a byte);
PyTorch's int4 kernel's own, which depends on the CPU, is made only if that kernel runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab import hardware
from attnlab.errors import BadInput

_COMPUTE = torch.bfloat16  # the kernels' activations (and the int4 kernel's scales and zeros)
# Up to this many rows (tokens) the integer kernels run, reading the codes once for all rows;
# their work grows with the rows, and beyond them a GEMM on the dequantised Ŵ is faster
_KERNEL_ROWS = 32
BITS = (8, 4, 2)


def float_dtype() -> torch.dtype:
    """The dtype of everything around the integer kernels (embeddings, norms, attention, a
    float output layer) and of int8's many-row GEMM: bfloat16 where the CPU runs it natively,
    float32 where bf16 is emulated (emulated bf16 around the kernels made a prompt several
    times slower; docs/benchmarks.md)."""
    return _COMPUTE if hardware.cpu_bf16().native else torch.float32


def _on_cpu(layer: nn.Module, x: Tensor) -> None:
    if x.device.type != "cpu":
        raise BadInput(f"{type(layer).__name__}: integer weights run on the CPU (the kernels are "
                       f"CPU ones), not on {x.device}: use --device cpu")


class _FixedDtypes(nn.Module):
    """A layer whose float tensors keep the dtypes its kernel reads (``_DTYPES``) when the
    model around it is cast (``model.to(torch.float32)``); moves between devices still apply."""

    _DTYPES: dict[str, torch.dtype] = {}

    def _apply(self, fn, recurse=True):
        kept = {name: getattr(self, name, None) for name in self._DTYPES}
        kept = {name: t.detach() for name, t in kept.items() if t is not None}
        super()._apply(fn, recurse)
        for name, dtype in self._DTYPES.items():
            t = getattr(self, name, None)
            if t is not None and t.dtype != dtype:  # the values before the cast, not rounded
                t.data = kept[name].to(device=t.device, dtype=dtype)
        return self


class Int8Linear(_FixedDtypes):
    """``y = x · Ŵᵀ (+ b)``, ``Ŵ[o, i] = s[o] · q[o, i]`` (module docstring); shapes
    ``x (..., in_features) -> (..., out_features)``, returned in ``x``'s dtype.

    ``activations``: ``"float"`` (weight-only: ``x`` in float32 through attnlab's kernel, in
    bfloat16 through PyTorch's fallback) or ``"dynamic"`` (``x`` quantised per call, an
    int8 × int8 GEMM, float32 out).
    """

    _DTYPES = {"scales": torch.float32, "kernel_scales": _COMPUTE, "bias": torch.float32}

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 activations: str = "float", device: torch.device | str | None = None):
        super().__init__()
        if activations not in ("float", "dynamic"):
            raise BadInput(f"activations must be 'float' or 'dynamic', got {activations!r}")
        self.in_features, self.out_features = in_features, out_features
        self.activations = activations
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8,
                                                    device=device))
        self.register_buffer("scales", torch.ones(out_features, device=device))
        # the kernel's bf16 copy of the scales, a buffer of its own: a cast inside a compiled
        # graph would hand inductor's lowering of the kernel an unrealised node (it fails)
        self.register_buffer("kernel_scales", self.scales.to(_COMPUTE), persistent=False)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device)) if bias else None
        self._packed = None  # the quantised engine's prepacked weight, made on first use

    @property
    def reduce_range(self) -> bool:
        """Whether dynamic activations get 7 bits instead of 8: on x86 without VNNI (module
        docstring), where 8-bit ones would saturate the int16 sums."""
        return (torch.backends.quantized.engine in ("fbgemm", "x86", "onednn")
                and not hardware.cpu_int8().native)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activations: str = "float") -> Int8Linear:
        w = linear.weight.detach().float()
        layer = cls(w.shape[1], w.shape[0], linear.bias is not None, activations, w.device)
        scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        layer.qweight = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        layer.scales, layer.kernel_scales = scale, scale.to(_COMPUTE)
        if linear.bias is not None:
            layer.bias.data = linear.bias.detach().float().clone()
        return layer

    @property
    def weight(self) -> Tensor:
        """The dequantised ``Ŵ (out, in)`` in float32."""
        return self.qweight.float() * self.scales[:, None]

    def _load_from_state_dict(self, *args, **kwargs):
        self._packed = None  # new weights: pack them again
        super()._load_from_state_dict(*args, **kwargs)
        self.kernel_scales = self.scales.detach().to(_COMPUTE)

    def _prepacked(self):
        if self._packed is None:
            q = torch._make_per_channel_quantized_tensor(
                self.qweight, self.scales.double(), torch.zeros(self.out_features,
                                                                dtype=torch.long), 0)
            bias = None if self.bias is None else self.bias.detach().float()
            self._packed = torch.ops.quantized.linear_prepack(q, bias)
        return self._packed

    def forward(self, x: Tensor) -> Tensor:
        _on_cpu(self, x)
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, self.in_features)
        if self.activations == "dynamic":  # the bias is inside the prepacked weight
            y = torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._prepacked(),
                                                   self.reduce_range)
        else:
            if x.shape[0] <= _KERNEL_ROWS and not x.requires_grad:  # decoding
                y = self._few_rows(x)
            else:  # many rows, or a gradient to pass: a float GEMM on Ŵ
                dtype = float_dtype()
                y = x.to(dtype) @ (self.qweight.to(dtype) * self.scales.to(dtype)[:, None]).t()
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features).to(dtype)

    def _few_rows(self, x: Tensor) -> Tensor:
        """``x (rows, in) · Ŵᵀ`` for a few rows, reading the int8 matrix, not a float one:
        PyTorch's kernel, in bfloat16 (:class:`attnlab.cpu.integer.KernelInt8Linear`: attnlab's,
        in float32)."""
        return torch.ops.aten._weight_int8pack_mm(x.to(_COMPUTE).contiguous(), self.qweight,
                                                  self.kernel_scales)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activations={self.activations}")


def fits_int4(in_features: int, out_features: int, group_size: int = 32) -> bool:
    """Whether the packed int4 kernel can tile a ``(out, in)`` matrix in groups of ``g``."""
    return in_features % group_size == 0 and out_features % 16 == 0


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """``(out, in)`` codes in ``0 … 2^bits − 1`` -> ``(out, in · bits / 8)`` uint8, the code of
    input ``i`` in bits ``(i mod k) · bits`` of byte ``i // k``, ``k = 8 / bits``."""
    k = 8 // bits
    c = codes.to(torch.uint8).view(codes.shape[0], -1, k)
    return sum(c[..., j] << (j * bits) for j in range(k)).to(torch.uint8)


def unpack_codes(packed: Tensor, bits: int) -> Tensor:
    """The inverse of :func:`pack_codes`: ``(out, in · bits / 8)`` -> ``(out, in)`` int32."""
    k, mask = 8 // bits, (1 << bits) - 1
    parts = [(packed >> (j * bits)) & mask for j in range(k)]
    return torch.stack(parts, -1).view(packed.shape[0], -1).to(torch.int32)


class Int4Linear(_FixedDtypes):
    """``y = x · Ŵᵀ (+ b)`` with ``Ŵ`` held as group-wise 4- or 2-bit codes (module
    docstring); shapes ``x (..., in_features) -> (..., out_features)``, returned in ``x``'s
    dtype.

    Build one with :meth:`from_codes` (codes taken as they are, e.g. from a GGUF file) or
    :meth:`from_linear` (quantise a float layer).
    """

    _DTYPES = {"scales": _COMPUTE, "zeros": _COMPUTE, "kernel_scales": torch.float16,
               "kernel_offsets": torch.float16, "bias": torch.float32}

    def __init__(self, in_features: int, out_features: int, group_size: int = 32,
                 bias: bool = False, bits: int = 4, device: torch.device | str | None = None):
        super().__init__()
        if bits not in (4, 2):
            raise BadInput(f"group-wise codes are 4 or 2 bits, got {bits}")
        if not fits_int4(in_features, out_features, group_size):
            raise BadInput(f"Int4Linear({in_features} -> {out_features}): in_features must be "
                           f"a multiple of group_size={group_size} and out_features of 16 "
                           "(the packed kernel's tiles)")
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.bits = group_size, bits
        groups = (out_features, in_features // group_size)
        # the codes two a byte (pack_codes at 4 bits); scale s and zero z (the value of code
        # 8) per group, in bf16 as they are saved; the kernel's s and b = z − 8s in float16
        # (Q4_1's 4 bytes a group: they are read with the codes at every token)
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2,
                                                    dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.zeros(groups, dtype=_COMPUTE, device=device))
        self.register_buffer("zeros", torch.zeros(groups, dtype=_COMPUTE, device=device))
        self.register_buffer("kernel_scales", torch.zeros(groups, dtype=torch.float16,
                                                          device=device), persistent=False)
        self.register_buffer("kernel_offsets", torch.zeros(groups, dtype=torch.float16,
                                                           device=device), persistent=False)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device)) if bias else None
        self._pytorch = None  # PyTorch's int4 kernel's packing, made if that kernel runs

    @classmethod
    def from_codes(cls, codes: Tensor, scale: Tensor, minimum: Tensor,
                   bias: Tensor | None = None, bits: int = 4) -> Int4Linear:
        """``codes (out, in)`` in ``0 … 2^bits − 1``, ``scale`` and ``minimum (out, in / g)``:
        ``W = scale · c + minimum``."""
        out_features, in_features = codes.shape
        layer = cls(in_features, out_features, in_features // scale.shape[1],
                    bias is not None, bits)
        layer._set(codes, scale.float(), minimum.float() + 8 * scale.float())
        if bias is not None:
            layer.bias.data = bias.float()
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, bits: int = 4) -> Int4Linear:
        """Quantise a float layer: each group's range onto ``2^bits`` levels. The codes are
        rounded against the bf16 scale and zero the layer keeps, so that the only error beyond
        ``s / 2`` is that rounding's, at the range's ends (and the kernel's float16 ``b``)."""
        w = linear.weight.detach().float()
        out_features, in_features = w.shape
        layer = cls(in_features, out_features, group_size, linear.bias is not None, bits)
        groups = w.view(out_features, in_features // group_size, group_size)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / (2 ** bits - 1)).clamp(min=2 ** -100).to(_COMPUTE).float()
        zero = (low + 8 * scale).to(_COMPUTE).float()
        codes = ((groups - zero[..., None]) / scale[..., None] + 8).round().clamp(
            0, 2 ** bits - 1)
        layer._set(codes.view(out_features, in_features), scale, zero)
        if linear.bias is not None:
            layer.bias.data = linear.bias.detach().float().clone()
        return layer

    def _set(self, codes: Tensor, scale: Tensor, zero: Tensor) -> None:
        """Codes ``(out, in)``, scale and zero ``(out, in / g)``, and the kernel's copies."""
        self.qweight = pack_codes(codes, 4)
        self.scales, self.zeros = scale.to(_COMPUTE), zero.to(_COMPUTE)
        self.kernel_scales = self.scales.to(torch.float16)
        self.kernel_offsets = (self.zeros.float() - 8 * self.scales.float()).to(torch.float16)
        self._pytorch = None

    @property
    def weight(self) -> Tensor:
        """The dequantised ``Ŵ = s · c + b`` ``(out, in)`` in float32, with the kernel's
        float16 ``s`` and ``b = z − 8s``."""
        codes = self.plain_codes().float().view(self.out_features, -1, self.group_size)
        w = codes * self.kernel_scales.float()[..., None] + self.kernel_offsets.float()[..., None]
        return w.view(self.out_features, self.in_features)

    def plain_codes(self) -> Tensor:
        """The codes ``c (out, in)``, int32."""
        return unpack_codes(self.qweight, 4)

    def _few_rows(self, x: Tensor) -> Tensor:
        """``x (rows, in) · Ŵᵀ`` for a few rows: PyTorch's int4 kernel, bf16 activations
        (:class:`attnlab.cpu.integer.KernelInt4Linear`: attnlab's)."""
        if self._pytorch is None:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(self.plain_codes(), 1)
            self._pytorch = packed, torch.stack([self.scales, self.zeros], -1).transpose(
                0, 1).contiguous()
        packed, scale_and_zero = self._pytorch
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(_COMPUTE).contiguous(), packed, self.group_size, scale_and_zero)

    def _matmul(self, x: Tensor) -> Tensor:
        """``x (rows, in) · Ŵᵀ`` without the bias, by the fastest route for ``rows``."""
        if x.shape[0] > _KERNEL_ROWS:  # a prompt: one float GEMM
            dtype = float_dtype()
            return x.to(dtype) @ self.weight.to(dtype).t()
        return self._few_rows(x)

    # on disk: the codes at their own width (module docstring)
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        shape = (self.out_features, self.in_features * self.bits // 8)
        if self.qweight.is_meta:  # a skeleton: shapes only
            destination[prefix + "qweight"] = torch.empty(shape, dtype=torch.uint8,
                                                          device="meta")
        else:
            destination[prefix + "qweight"] = (self.qweight if self.bits == 4 else
                                               pack_codes(self.plain_codes(), self.bits))
        destination[prefix + "scales"] = self.scales
        destination[prefix + "zeros"] = self.zeros
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        names = ["qweight", "scales", "zeros"] + (["bias"] if self.bias is not None else [])
        found = {n: state_dict[prefix + n] for n in names if prefix + n in state_dict}
        missing_keys.extend(prefix + n for n in names if n not in found)
        if len(found) < len(names):
            return
        groups = (self.out_features, self.in_features // self.group_size)
        expected = {"qweight": (self.out_features, self.in_features * self.bits // 8),
                    "scales": groups, "zeros": groups, "bias": (self.out_features,)}
        for n, t in found.items():
            if tuple(t.shape) != expected[n]:
                error_msgs.append(f"{prefix}{n}: shape {tuple(t.shape)}, expected {expected[n]}")
                return
        self._set(unpack_codes(found["qweight"].to(torch.uint8), self.bits),
                  found["scales"].float(), found["zeros"].float())
        if self.bias is not None:
            self.bias.data = found["bias"].float()

    def forward(self, x: Tensor) -> Tensor:
        _on_cpu(self, x)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        y = _Int4MatMul.apply(x2, self) if x2.requires_grad else self._matmul(x2)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, group_size={self.group_size}, bias={self.bias is not None}")


class _Int4MatMul(torch.autograd.Function):
    """``x · Ŵᵀ`` through the int4 kernel, with a gradient for ``x`` (the kernel has none):
    ``∂L/∂x = ∂L/∂y · Ŵ``, ``Ŵ`` dequantised for the backward pass only and dropped after.
    The codes never train; this lets LoRA train over frozen 4-bit layers (QLoRA's setting,
    Dettmers et al., 2023) with the gradient passing through them to the layers below."""

    @staticmethod
    def forward(ctx, x: Tensor, layer: Int4Linear) -> Tensor:
        ctx.layer, ctx.dtype = layer, x.dtype
        return layer._matmul(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (grad.float() @ ctx.layer.weight).to(ctx.dtype), None


def quantize(model: nn.Module, bits: int = 4, group_size: int = 32,
             activations: str = "float", skip: tuple[str, ...] = ("lm_head",),
             skeleton: bool = False, only: set[str] | None = None) -> list[str]:
    """Replace ``model``'s ``nn.Linear`` layers by integer ones, in place; returns their names.

    ``bits`` 8: :class:`Int8Linear` (per channel); ``bits`` 4 or 2: :class:`Int4Linear` in
    groups of ``group_size``. The rest of the model is cast to :func:`float_dtype` (bfloat16
    where the CPU runs it natively), except with ``activations="dynamic"`` (int8 only), whose
    GEMM takes float32.
    Layers named ``...skip`` (the output projection, often tied to the embedding) stay float;
    so do layers whose shape the int4 kernel cannot tile (``fits_int4``). ``skeleton``: make
    empty layers of the right shapes (to load saved codes into), on the weights' device;
    ``only``: quantise just these layers.
    """
    if bits not in BITS:
        raise BadInput(f"bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    done = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if (not isinstance(child, nn.Linear) or (skip and full.endswith(skip))
                    or (only is not None and full not in only)):
                continue
            has_bias, device = child.bias is not None, child.weight.device
            if bits == 8:
                new = (Int8Linear(child.in_features, child.out_features, has_bias, activations,
                                  device) if skeleton else Int8Linear.from_linear(child,
                                                                                  activations))
            elif fits_int4(child.in_features, child.out_features, group_size):
                new = (Int4Linear(child.in_features, child.out_features, group_size, has_bias,
                                  bits, device) if skeleton
                       else Int4Linear.from_linear(child, group_size, bits))
            else:
                continue
            setattr(module, child_name, new)
            done.append(full)
    if activations != "dynamic":
        model.to(float_dtype())
    return done


def integer_parts(model: nn.Module) -> tuple[int, torch.dtype] | None:
    """``(bits, float dtype)`` of a model holding integer layers: the fewest bits among them
    (8 for int8) and the dtype of its largest float tensor (the embedding: what the float
    parts compute in); None for a float model. What the announce line says of a quantised
    folder."""
    bits = [getattr(m, "bits", 8) for m in model.modules()
            if isinstance(m, (Int8Linear, Int4Linear))]
    if not bits:
        return None
    floats = [p for p in model.parameters() if p.is_floating_point()]
    dtype = max(floats, key=lambda p: p.numel()).dtype if floats else float_dtype()
    return min(bits), dtype


__all__ = ["BITS", "Int4Linear", "Int8Linear", "fits_int4", "float_dtype", "integer_parts",
           "pack_codes", "quantize", "unpack_codes"]
