"""attnlab's own integer matrix products for decoding, compiled from ``int_kernels.cpp`` on
first use and cached on disk; :mod:`attnlab.nn.quantized`'s layers call them for a few rows.

Why our own: on a CPU one decoded token reads every weight once, so the kernel must read
its codes at the memory's speed. PyTorch's int4 and int8 CPU kernels for one row read at
3–8 GB/s on a 17 GB/s AVX2 machine (docs/benchmarks.md). These two, for ``x (m, in)``
float32 and ``y (m, out)`` float32:

* ``int8_matmul(x, codes, scales, group)``: ``y[m, n] = Σ_g s[n, g] · Σ_{k∈g} q[n, k] x[m, k]``,
  codes int8 ``(out, in)``, scales float32 ``(out, in / g)``; ``g = in`` is one scale per
  channel, ``g = 32`` GGUF's Q8_0. The activations stay float32: the result differs from
  ``x · Ŵᵀ`` in float32 by the order of the sums only.
* ``int4_matmul(x, codes, scales, offsets, group)``: ``Ŵ[n, k] = s[n, g] · c[n, k] + b[n, g]``
  with 4-bit codes two to a byte (:func:`attnlab.nn.quantized.pack_codes`). Converting
  every 4-bit code to float costs more than reading it, so the codes meet ``x`` in exact
  integer sums (``vpmaddwd`` on AVX2): ``x`` is rounded per 32 inputs to 16 bits,
  ``x̂ = s_x · q_x``, ``s_x = max |x| / 32767``, and the offsets take the exact float ``Σ x``.
  So ``|y − x · Ŵᵀ| ≤ ½ Σ_chunks s_x · Σ_k |s · c|`` plus float32 rounding: a relative
  step of 2⁻¹⁵ of the chunk's largest input, 64 times finer than bf16's 2⁻⁹ (llama.cpp
  rounds ``x`` to 8 bits here; that moved SmolLM2's logits 4x more than bf16 did).

Building needs the C++ compiler that ``torch.compile`` needs too; about 15 s, once per
machine and torch version (``$ATTNLAB_CACHE_DIR``, default ``~/.cache/attnlab``). It is
compiled for the CPU capability ATen reports (AVX2 code on AVX2 and AVX-512 x86, so the
AVX2 emulation runs what an AVX2 laptop runs; portable vector code elsewhere) and threads
with the OpenMP runtime torch itself loaded, never a second one. Where it cannot be built, or
with ``ATTNLAB_INT_KERNELS=0``, :func:`available` is False and the layers fall back to
PyTorch's kernels, with one warning.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("int_kernels.cpp")


def _openmp_runtime() -> str | None:
    """The OpenMP library this process already runs torch's threads on (linking it again by
    path makes the kernels share its pool), or None."""
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if re.search(r"/lib(g|i)?omp[-.\w]*\.so", path):
                return path
    here = Path(torch.__file__).parent / "lib"
    found = sorted(glob.glob(str(here / "libgomp*.so*")) + glob.glob(str(here / "libomp*")))
    return found[0] if found else None


def _flags() -> tuple[list[str], list[str]]:
    """Compiler and linker flags: the ISA ATen runs at, and torch's OpenMP when there is one."""
    cflags, ldflags = ["-O3"], []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        cflags += ["-mavx2", "-mfma", "-mf16c"]
    runtime = _openmp_runtime() if torch.backends.openmp.is_available() else None
    if runtime is not None and os.name == "posix" and not runtime.endswith(".dylib"):
        cflags.append("-fopenmp")
        ldflags.append(runtime)
    return cflags, ldflags


def _cache_dir() -> Path:
    root = os.environ.get("ATTNLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "attnlab")
    return Path(root) / "kernels"


_LOADED: bool | None = None  # decided once a process


def available() -> bool:
    """Whether attnlab's integer kernels are built and loaded (``torch.ops.attnlab.*``). The
    integer layers ask when they are made, so that a compiled graph only reads the answer."""
    global _LOADED
    if _LOADED is None:
        _LOADED = _load()
    return _LOADED


def _load() -> bool:
    if os.environ.get("ATTNLAB_INT_KERNELS", "1") == "0":
        return False
    cflags, ldflags = _flags()
    key = hashlib.sha256("\n".join([_SOURCE.read_text(), torch.__version__, *cflags, *ldflags])
                         .encode()).hexdigest()[:16]
    name = f"attnlab_int_kernels_{key}"
    where = _cache_dir() / name
    try:
        from torch.utils import cpp_extension

        where.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name, [str(_SOURCE)], extra_cflags=cflags, extra_ldflags=ldflags,
                           build_directory=str(where), is_python_module=False, verbose=False)
    except Exception as error:  # no compiler, no ninja, an unwritable cache: run without them
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"attnlab's integer kernels could not be built ({first}); integer layers "
                      "use PyTorch's kernels, slower", RuntimeWarning, stacklevel=2)
        return False
    _register_shapes()
    return True


def _register_shapes() -> None:
    """What ``torch.compile`` needs to trace through the kernels: the output's shape."""
    for op in ("attnlab::int8_matmul", "attnlab::int4_matmul"):
        torch.library.register_fake(op)(_output_like)


def _output_like(x: torch.Tensor, codes: torch.Tensor, *rest) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0])


__all__ = ["available"]
