"""attnlab.cpu: the CPU engine, applied to a built model from beside it.

The teaching blocks in :mod:`attnlab.nn` compute each equation plainly. Decoding on a CPU reads
every weight once per token, so speed there is a matter of bytes and kernels: this package holds
attnlab's own C++ kernels (``csrc/``) and their loader (:mod:`~attnlab.cpu.kernels`), the layers
that call them (:mod:`~attnlab.cpu.linear`, :mod:`~attnlab.cpu.integer`,
:mod:`~attnlab.cpu.attention`), and the preparation that swaps them into a finished model
(:func:`for_decoding`, :mod:`~attnlab.cpu.prepare`), as gpt-fast applies quantisation and
torchtitan applies parallelism. An encoder's forward pass over whole sentences is arithmetic,
not bytes: :func:`for_encoding` (:mod:`~attnlab.cpu.encoder`) packs its matrices once for
oneDNN. Nothing in ``nn/`` imports it.
"""

from attnlab.cpu.attention import DecodeAttention, attention_kernel_, decode_attention
from attnlab.cpu.encoder import PackedFeedForward, PackedLinear, for_encoding
from attnlab.cpu.integer import KernelInt4Linear, KernelInt8Linear, integer_kernels_
from attnlab.cpu.kernels import available, bf16_dot_rows
from attnlab.cpu.linear import KernelLinear, decoding_layout_, fuse_projections_
from attnlab.cpu.prepare import (
    decoding_kernels_,
    float32_activations_,
    for_decoding,
    integer_head,
)

__all__ = ["DecodeAttention", "KernelInt4Linear", "KernelInt8Linear", "KernelLinear",
           "PackedFeedForward", "PackedLinear", "for_encoding",
           "attention_kernel_", "available", "bf16_dot_rows", "decode_attention",
           "decoding_kernels_",
           "decoding_layout_", "float32_activations_", "for_decoding", "fuse_projections_",
           "integer_head", "integer_kernels_"]
