"""Preparing a built model for decoding: the CPU engine applied from beside the model.

Decoding reads every weight once per token, so what it costs is the bytes of the matrices and
the kernels that read them. :func:`for_decoding` casts the matrices to the decoding precision
and, on a CPU, swaps attnlab's kernels into the model's linears (:mod:`attnlab.cpu.linear`),
integer layers (:mod:`attnlab.cpu.integer`) and attention (:mod:`attnlab.cpu.attention`), with
float32 activations around 16-bit matrices (:func:`float32_activations_`) and an int8 output
layer for integer models (:func:`integer_head`). The model's own code never changes: only which
class each of its modules is and the dtype of its tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.cpu import kernels as cpu_kernels
from attnlab.cpu.attention import attention_kernel_
from attnlab.cpu.integer import KernelInt8Linear, integer_kernels_
from attnlab.cpu.linear import KernelLinear, decoding_layout_, fuse_projections_
from attnlab.errors import BadInput


def for_decoding(model: nn.Module, device: torch.device | str | None = None,
                 precision: str = "fp32", integer: bool = False, rows: int = 1,
                 kv_cache: str | None = None) -> nn.Module:
    """``model`` ready to decode on ``device``: its matrices cast to ``precision`` (decoding reads
    every weight once per token, so half the bytes is what makes it faster) and, on a CPU, its
    fp32, bf16 or fp16 linears on attnlab's few-row kernel (:func:`decoding_layout_`; where
    that cannot be built, fp32 is stored input-major for ``rows`` = 1 sequence, row-major for
    a batch). On that kernel only the matrices take ``precision``: the activations, norms and
    KV cache are float32 (:func:`float32_activations_`); elsewhere (a GPU) the whole model is
    cast. An
    ``integer`` model (``--int4``, ``--int8``) keeps its integer matrices and the float dtype
    ``quantize`` gave the other matrices (float32 activations on the kernel), runs on the CPU
    only, and gets an int8 output layer
    (:func:`integer_head`). On a CPU the integer layers and attention run attnlab's kernels
    (:func:`~attnlab.cpu.integer.integer_kernels_`,
    :func:`~attnlab.cpu.attention.attention_kernel_`). Integer and kernel layers have their
    Q/K/V and W₁/W₃ stacked into one product each
    (:func:`~attnlab.cpu.linear.fuse_projections_`). ``model`` is changed in
    place and its names change (``qkv``, ``w13``): a model for decoding, not one to save or to
    add adapters to. ``kv_cache`` ("fp32", "bf16", "fp16"): the dtype its KV caches are stored
    in (``model.cache_dtype``; default: the activations'); a 16-bit cache under float32
    activations halves the bytes a long context reads at each token, its keys and values
    rounded as they are stored (the compiled step may then part from eager greedy text)."""
    from attnlab.hardware import DTYPES

    on_cpu = (torch.device(device).type if device is not None
              else next(model.parameters()).device.type) == "cpu"
    kernel = on_cpu and cpu_kernels.available()  # float32 activations (below)
    if kv_cache is not None:  # checked before the model changes
        if kv_cache not in DTYPES or not hasattr(type(model), "cache_dtype"):
            raise BadInput(f"kv_cache must be one of {', '.join(DTYPES)} for a decoder-only "
                           f"model, got {kv_cache!r} for a {type(model).__name__}")
        if not kernel and kv_cache != precision:
            raise BadInput(f"a {kv_cache} KV cache under {precision} activations is read by "
                           "attnlab's CPU kernels only; elsewhere the cache is the activations' "
                           "dtype")
    if integer:
        if not on_cpu:
            raise BadInput(f"integer weights (--int4, --int8) run on the CPU only, not on "
                           f"{device}")
        integer_head(model)
        dtype = None  # the float matrices keep the dtype quantize gave them
    else:
        dtype = DTYPES[precision]
        if not kernel:  # the whole model in the dtype
            model = model.to(device=device, dtype=dtype)
        elif device is not None:  # (float32_activations_ casts the matrices alone)
            model = model.to(device)
    if on_cpu:  # attnlab's integer products and one-query attention (each falls back alone)
        decoding_kernels_(model)
    model = fuse_projections_(decoding_layout_(model, rows))  # (after: KernelLinear)
    if kernel:
        float32_activations_(model, dtype)
    if kv_cache is not None:
        model.cache_dtype = DTYPES[kv_cache]
    return model


def decoding_kernels_(model: nn.Module) -> nn.Module:
    """What every decoding loop applies to the model it is given, in place (a model that
    :func:`for_decoding` prepared already has it): on a CPU, its integer layers and its
    one-query attention on attnlab's kernels (:func:`~attnlab.cpu.integer.integer_kernels_`,
    :func:`~attnlab.cpu.attention.attention_kernel_`); returns ``model``."""
    return attention_kernel_(integer_kernels_(model))


@torch.no_grad()
def float32_activations_(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Decode with float32 activations around 16-bit matrices, in place; returns ``model``: each
    :class:`~attnlab.cpu.linear.KernelLinear`'s weight and bias and each token embedding's table
    in ``dtype`` (None: as they are; a parameter tied to one of them follows it), the integer
    layers as they are, every other floating parameter and buffer (norms, positions, other
    layers) in float32, positional tables computed again in float32, and the token embeddings'
    rows widened (``out_dtype``). So the residual stream, the norms, the KV cache and the logits
    are float32, as llama.cpp keeps the values between its products (its KV cache is 16-bit by
    default; here float32 unless ``kv_cache`` asks for 16 bits). The kernel widens ``W``
    exactly, so a layer computes ``x · Ŵᵀ`` of the rounded weights ``Ŵ`` in float32's sums, for
    up to its 8 rows (a token, a batch of 8); more rows (a prompt, speculative decoding's
    verification of 11 tokens, a server's larger batch) round ``x`` for the 16-bit GEMM, which
    reuses each weight better there. A step of 4 to 8 sequences (or
    beams) through a bf16 layer rounds ``x`` too where the kernels run AVX512-BF16, for
    ``vdpbf16ps`` (:func:`~attnlab.cpu.kernels.bf16_dot_rows`: with float32 ``x`` such a
    batch is compute-bound); 1 to 3 sequences, and up to 8 tokens of one sequence, never do.

    Why: with bf16 activations every op rounds its output, and the compiled step, which fuses
    ops and rounds where it fuses, parted from the eager step's greedy text after a few dozen
    tokens. The cost is the KV cache's bytes, which a long context reads at every token
    (docs/benchmarks.md)."""
    from attnlab.nn.embeddings import TokenEmbedding
    from attnlab.nn.positional import PositionalEncoding
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    matrices = {id(t) for m in model.modules() if isinstance(m, (KernelLinear, TokenEmbedding))
                for t in m.parameters(recurse=False)}
    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            continue
        for t in m.parameters(recurse=False):
            own = dtype if id(t) in matrices else torch.float32
            if t.is_floating_point() and own is not None and t.dtype != own:
                t.data = t.data.to(own)  # (the same Parameter: a tied one follows)
        for name, t in list(m.named_buffers(recurse=False)):
            if t.is_floating_point() and t.dtype != torch.float32:
                m._buffers[name] = t.float()
        if isinstance(m, PositionalEncoding):  # computed in float32, not bf16's values widened
            device = next((b.device for b in m.buffers(recurse=False)), None)
            m.reset_buffers()
            if device is not None:
                m.to(device)
        if isinstance(m, TokenEmbedding):
            m.out_dtype = torch.float32
    return model


def integer_head(model: nn.Module) -> None:
    """The output layer ``lm_head`` as int8 codes with one scale per row (the embedding,
    often tied to it, stays float: a lookup reads one row). For SmolLM2 the head is 113 MB
    in float32, the largest matrix a token reads, and 28 MB in int8; measured in
    docs/benchmarks.md (speed, and nats per token). Only where attnlab's int8 kernel runs:
    its float32 activations keep the logits' order, which PyTorch's bf16 kernel did not."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear) and cpu_kernels.available():
        model.lm_head = KernelInt8Linear.from_linear(head)
