"""The GGUF container (llama.cpp's file format), read: its metadata as Python values and each
tensor's type, shape and bytes, viewed in the file without a copy.

    header      "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64
    metadata    key (string), value type u32, value          string = u64 length, UTF-8 bytes
    tensors     name, n_dims u32, dims u64 × n_dims (innermost first), type u32, offset u64
    data        from the first multiple of ``general.alignment`` (32) after the infos

Why not the ``gguf`` package's ``GGUFReader``: it makes NumPy views for every part of every
metadata value, 49,152 tokens and 48,900 merges for SmolLM2, where a loop over the bytes is
two orders of magnitude quicker. The package still names the tensor types and dequantises
them.

The file is untrusted: every count and length is checked against the bytes left before
anything is allocated for it, and a tensor's bytes must lie inside the file. Anything wrong is
a :class:`~attnlab.errors.BadInput` naming the file and what is wrong.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import BadInput

# metadata value types: struct format of the scalars (8 is a string, 9 an array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_MAX_DIMS = 4  # GGML_MAX_DIMS


@dataclass
class GGUFTensor:
    """One tensor: ``shape`` innermost first (as GGUF stores it: ``(in, out)`` for a matrix),
    ``tensor_type`` the ``gguf`` package's ``GGMLQuantizationType``, and ``data`` its bytes
    as the ``gguf`` package shapes them: float types as ``(out, in)`` arrays of their dtype,
    block-quantised ones as ``(out, bytes a row)`` uint8."""

    name: str
    shape: tuple[int, ...]
    tensor_type: object
    data: np.ndarray


class GGUFFile:
    """A GGUF file's ``metadata`` (key -> int, float, bool, str, list of str, or a read-only
    NumPy array of numbers) and ``tensors`` (in file order). Arrays of numbers and the
    tensors' data are views of a read-only memory map, valid while this object lives."""

    def __init__(self, path: str | Path):
        import gguf  # (the tensor types' names and block sizes)

        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self.path.stat().st_size
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:  # a folder, no permission
            raise BadInput(f"{self.path}: cannot be read ({e.strerror or e})") from None
        self._at, self._part = 0, "header"  # (the part being read, for the error)
        try:
            self._read(gguf)
        except (struct.error, UnicodeDecodeError, OverflowError, ValueError) as e:
            if isinstance(e, BadInput):
                raise
            raise BadInput(f"{self.path}: damaged {self._part} ({e})") from None

    # --- the byte stream ---------------------------------------------------------------------
    def _unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self._buf, self._at)[0]
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        if n > len(self._buf) - self._at:
            raise ValueError(f"a string of {n:,} bytes runs past the end of the file")
        text = bytes(self._buf[self._at:self._at + n]).decode("utf-8")
        self._at += n
        return text

    def _value(self, kind: int):
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])
        if kind == 8:
            return self._string()
        if kind != 9:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self._unpack("<I"), self._unpack("<Q")
        if item in _NUMPY:  # a block of numbers: a read-only view of the file, no copy
            width = np.dtype(_NUMPY[item]).itemsize
            if count * width > len(self._buf) - self._at:
                raise ValueError(f"an array of {count:,} numbers runs past the end of the file")
            values = np.frombuffer(self._buf, _NUMPY[item], count, self._at)
            self._at += count * width
            return values
        if count > len(self._buf) - self._at:  # every value takes at least a byte
            raise ValueError(f"an array of {count:,} values in {len(self._buf):,} bytes")
        if item == 8:
            return [self._string() for _ in range(count)]
        raise ValueError(f"arrays of type {item} are not read")  # (nested arrays: none needed)

    # --- the sections ------------------------------------------------------------------------
    def _read(self, gguf) -> None:
        if bytes(self._buf[:4]) != b"GGUF":
            raise BadInput(f"{self.path}: not a GGUF file (no GGUF header)")
        self._at = 4
        version, n_tensors, n_kv = self._unpack("<I"), self._unpack("<Q"), self._unpack("<Q")
        if version not in (2, 3):
            raise BadInput(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        left = len(self._buf) - self._at  # an info takes at least 33 bytes, an entry 13
        if n_tensors * 33 > left or n_kv * 13 > left:
            raise BadInput(f"{self.path}: the header claims {n_tensors:,} tensors and {n_kv:,} "
                           f"metadata entries, more than a file of {len(self._buf):,} bytes "
                           "can hold")
        self.metadata: dict = {}
        self._part = "metadata"
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("<I"))
        infos = []
        self._part = "tensor information"
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            shape = tuple(self._unpack("<Q") for _ in range(n_dims))
            infos.append((name, shape, self._unpack("<I"), self._unpack("<Q")))
        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment={str(alignment)[:40]} is not a power of two")
        start = -(-self._at // alignment) * alignment
        self.tensors = [self._tensor(gguf, start, alignment, *info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError("a tensor name appears twice")

    def _tensor(self, gguf, start: int, alignment: int, name: str, shape: tuple, kind: int,
                offset: int) -> GGUFTensor:
        try:
            ggml_type = gguf.GGMLQuantizationType(kind)
            block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name!r} has an unknown type {kind}") from None
        if shape[0] % block:
            raise ValueError(f"tensor {name!r}: rows of {shape[0]} are not whole blocks of "
                             f"{block}")
        rows = 1
        for n in shape[1:]:
            rows *= n
        row_bytes = shape[0] // block * type_size
        if offset % alignment:
            raise ValueError(f"tensor {name!r} starts at {offset}, not a multiple of the "
                             f"alignment {alignment}")
        at = start + offset
        if at + rows * row_bytes > len(self._buf):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        plain = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
                 "I16": np.int16, "I32": np.int32, "I64": np.int64}.get(ggml_type.name)
        outer = tuple(reversed(shape[1:]))
        if plain is not None:
            data = np.frombuffer(self._buf, plain, rows * shape[0], at).reshape(*outer, shape[0])
        else:
            data = np.frombuffer(self._buf, np.uint8, rows * row_bytes, at).reshape(*outer,
                                                                                 row_bytes)
        return GGUFTensor(name, shape, ggml_type, data)


__all__ = ["GGUFFile", "GGUFTensor"]
