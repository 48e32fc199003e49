"""attnlab's own CPU kernels for decoding (``csrc/``), compiled from C++ on first use and cached
on disk: :mod:`attnlab.cpu.integer`'s layers call the integer matrix products for a few rows,
:class:`attnlab.cpu.linear.KernelLinear` the float one, and :mod:`attnlab.cpu.attention` the
one-query attention.

Why our own: on a CPU one decoded token reads every weight once, so the kernel must read
its codes at the memory's speed, and PyTorch's int4 and int8 CPU kernels for one row read well
below it (docs/benchmarks.md). ``int_kernels.cpp``, for
``x (m, in)`` float32 and ``y (m, out)`` float32:

* ``int8_matmul(x, codes, scales, group)``: ``y[m, n] = Σ_g s[n, g] · Σ_{k∈g} q[n, k] x[m, k]``,
  codes int8 ``(out, in)``, scales float32 ``(out, in / g)``; ``g = in`` is one scale per
  channel, ``g = 32`` GGUF's Q8_0. The activations stay float32: the result differs from
  ``x · Ŵᵀ`` in float32 by the order of the sums (and the scale applied per group) only.
* ``int4_matmul(x, codes, scales, offsets, group)``: ``Ŵ[n, k] = s[n, g] · c[n, k] + b[n, g]``
  with 4-bit codes two to a byte (:func:`attnlab.nn.quantized.pack_codes`). Converting
  every 4-bit code to float costs more than reading it, so the codes meet ``x`` in exact
  integer sums (``vpmaddwd`` on AVX2): ``x`` is rounded per 32 inputs to 16 bits,
  ``x̂ = s_x · q_x``, ``s_x = max |x| / 32767``, and the offsets take the exact float ``Σ x``.
  So ``|y − x · Ŵᵀ| ≤ ½ Σ_chunks s_x · Σ_k |s · c|`` plus float32 rounding: a step of
  2⁻¹⁵ of the chunk's largest input, against bf16's 2⁻⁹ of each input's own size (finer for
  inputs within 64x of their chunk's largest; llama.cpp rounds ``x`` to 8 bits here, a
  coarser step; docs/benchmarks.md compares the logits of the three).

``float_kernels.cpp``: ``float_matmul(x, weight, bias)``, ``y = x · Wᵀ + b`` for a few rows,
``W (out, in)`` row-major float32, float16 or bfloat16 (widened to float32 as it is read), the
sums in float32; ``x`` and ``b`` float32 or ``W``'s dtype, ``y`` in ``x``'s (rounded once), so
a bf16 layer's call has no conversions around it; :class:`attnlab.cpu.linear.KernelLinear`
calls it. ``bf16_batch_matmul(x, weight, bias)``: a bf16 ``W`` against a decoding step of
several sequences, ``x`` rounded to bf16 and multiplied with AVX512-BF16's ``vdpbf16ps``
where that is built and runs (:func:`bf16_dot_rows`), else ``float_matmul``.

``decode_attention.cpp``: ``decode_attention(q, k, v, mask, scale)``, softmax attention of one
query a row ``q (b, h, 1, d)`` over a cache ``k, v (b, h_kv, slots, d)`` (grouped queries;
k and v float32, bfloat16 or float16, q of their dtype or float32, the sums in float32),
``mask (b or 1, slots)`` boolean, True = may attend. It stops at each row's last allowed
slot, so a static cache's empty tail is never read; a row with none gives zeros.

Building needs the C++ compiler that ``torch.compile`` needs too, once per
machine and torch version (``$ATTNLAB_CACHE_DIR``, default ``~/.cache/attnlab``, else the
temporary folder; a failed build leaves a ``FAILED`` file there, so that later processes do
not retry it). It is
compiled for the CPU capability ATen reports (AVX2 code on AVX2 and AVX-512 x86, so the
AVX2 emulation runs what an AVX2 laptop runs, plus ``bf16_batch_matmul``'s AVX-512 code where
the CPU has AVX512-BF16; portable vector code elsewhere) and threads
with the OpenMP runtime torch itself loaded, never a second one (on macOS it runs on one
thread: torch's libomp is not linked). Where it cannot be built (Windows: the source is
GCC/Clang C++), :func:`available` is False and the layers fall back to PyTorch's kernels
(attention to its fused one), with one warning; ``ATTNLAB_CPU_KERNELS=0`` asks for that
fallback, without the warning.
"""

from __future__ import annotations

import glob
import hashlib
import os
import platform
import re
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

# the dtypes the float product reads its weights in and decode attention its cache in
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = [_CSRC / n for n in ("int_kernels.cpp", "float_kernels.cpp", "decode_attention.cpp")]
_HEADERS = [_CSRC / "vectors.h"]  # (part of the cache key)
_DPBF16 = "-DATTNLAB_DPBF16"  # bf16_batch_matmul's vdpbf16ps (float_kernels.cpp)
_WIDE = "-DATTNLAB_WIDE"  # the batched float product's AVX-512 blocks (float_kernels.cpp)


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


def hand_over_threads() -> bool:
    """Free the calling thread's OpenMP worker threads (``omp_pause_resource_all``), before
    another thread takes over running the model (a server's engine). GNU OpenMP counts every
    pool's workers: once they outnumber the CPUs, workers stop spinning between parallel
    regions and sleep, so each of a decoding step's hundreds of small regions waits for them
    to wake (docs/serving.md). A later parallel region on this thread makes a new pool.
    Whether it was done: False where torch runs no GNU OpenMP (LLVM's libomp would stop its
    whole runtime) or the runtime lacks the call."""
    import ctypes

    runtime = _openmp_runtime() if torch.backends.openmp.is_available() else None
    if runtime is None or "gomp" not in Path(runtime).name:
        return False
    try:
        pause = ctypes.CDLL(runtime).omp_pause_resource_all
    except (OSError, AttributeError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(2) == 0  # omp_pause_hard: the threads go, not only their memory


def _flags() -> tuple[list[str], list[str]]:
    """Compiler and linker flags: the ISA ATen runs at, and torch's OpenMP when there is one."""
    cflags, ldflags = ["-O3"], []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        cflags += ["-mavx2", "-mfma", "-mf16c"]
    if capability == "AVX512":  # the batched float product's wider blocks (float_kernels.cpp)
        cflags.append(_WIDE)
    if capability == "AVX512" and _bf16_dot():
        cflags.append(_DPBF16)
    runtime = _openmp_runtime() if torch.backends.openmp.is_available() else None
    if runtime is not None and os.name == "posix" and not runtime.endswith(".dylib"):
        cflags.append("-fopenmp")
        ldflags.append(runtime)
    return cflags, ldflags


BF16_DOT_ROWS = 4  # a step of this many sequences or more takes bf16_batch_matmul


def bf16_dot_rows() -> int | None:
    """From how many sequences a decoding step multiplies a bf16 layer's weight by ``x``
    rounded to bf16 with AVX512-BF16's ``vdpbf16ps`` (``bf16_batch_matmul``: float32 sums; with
    float32 ``x`` such a batch is bound by widening the weights and multiply-adds), or None
    where the kernels do not run it (a CPU without AVX512-BF16, ATen below AVX-512,
    ``ATTNLAB_NATIVE_BF16=0`` or ``ATTNLAB_DPBF16=0``, a compiler without it, said once).
    One to 3 sequences, several tokens of one sequence (a prompt, speculative verification)
    and other dtypes keep float32 ``x``; beam search's beams are sequences here."""
    return _DOT_ROWS if available() else None


def _bf16_dot() -> bool:
    """Whether to build ``vdpbf16ps``: the CPU lists AVX512-BF16 and neither
    ``ATTNLAB_NATIVE_BF16=0`` (with ``ATEN_CPU_CAPABILITY=avx2``, a CPU without it) nor
    ``ATTNLAB_DPBF16=0`` (float32 ``x`` for batches too) turns it off."""
    from attnlab.hardware import cpu_flags

    return (os.environ.get("ATTNLAB_NATIVE_BF16") != "0"
            and os.environ.get("ATTNLAB_DPBF16") != "0" and "avx512_bf16" in cpu_flags()[1])


def _cache_dir() -> Path:
    """``$ATTNLAB_CACHE_DIR`` (else ``$XDG_CACHE_HOME/attnlab``, ``~/.cache/attnlab``), or the
    temporary folder where that cannot be written (a read-only home)."""
    root = os.environ.get("ATTNLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "attnlab")
    path = Path(root) / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"attnlab-{user}" / "kernels"


_LOADED: bool | None = None  # decided once a process
_DOT_ROWS: int | None = None  # bf16_dot_rows(), once loaded
_LOCK = threading.Lock()


def available() -> bool:
    """Whether attnlab's kernels are built and loaded (``torch.ops.attnlab.*``). The integer
    layers ask when they are made, attention at each call, and :class:`CompiledStep` before it
    compiles, so that a compiled graph only reads the answer."""
    global _LOADED
    if _LOADED is not None:  # (all a compiled graph traces: the lock is for the first call)
        return _LOADED
    if torch.compiler.is_compiling():  # nothing is built inside a trace: PyTorch's kernels
        return False  # (CompiledStep asks before it compiles; a later trace sees the answer)
    with _LOCK:
        if _LOADED is None:
            _LOADED = _load()
    return _LOADED


def _load() -> bool:
    if os.environ.get("ATTNLAB_CPU_KERNELS", "1") == "0":
        return False
    if os.name == "nt":  # the source is GCC/Clang C++ (vector extensions), not MSVC's
        return _without("not built on Windows")
    cflags, ldflags = _flags()
    built = _build(cflags, ldflags)
    avx512 = (_DPBF16, _WIDE)
    if built is not True and any(f in cflags for f in avx512):  # (an assembler without
        # AVX-512, say): the AVX2 kernels alone
        why, built = built, _build([f for f in cflags if f not in avx512], ldflags)
        if built is True:  # said, not silent: its FAILED file would keep it off
            warnings.warn(f"attnlab's AVX-512 kernels could not be built ({why}); a step of "
                          "several sequences runs the AVX2 ones (bf16 with float32 "
                          "activations), slower", RuntimeWarning, stacklevel=3)
    if built is not True:
        return _without(built)
    global _DOT_ROWS
    _DOT_ROWS = BF16_DOT_ROWS if torch.ops.attnlab.bf16_dot_here() else None
    return True


def _build_name(cflags: list[str], ldflags: list[str]) -> str:
    """The build's folder name: a hash of the sources, their folder, torch, the platform and
    the flags. The folder is part of it because ninja's build file names the sources by path:
    two installed copies of attnlab sharing one build folder would rebuild it in turn."""
    parts = [*(f.read_text() for f in _SOURCES + _HEADERS), str(_CSRC.resolve()),
             torch.__version__, sys.platform, platform.machine(), *cflags, *ldflags]
    return "attnlab_kernels_" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


STALE_LOCK_SECONDS = 600  # a build holds its lock for a minute or two at most


def _clear_stale_lock(where: Path) -> bool:
    """Remove a build lock left behind by a process killed while it built (torch's lock file
    holds no owner, so every later process would wait on it for ever): one older than
    :data:`STALE_LOCK_SECONDS`. Whether one was removed."""
    lock = where / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:  # none
        return False
    if age < STALE_LOCK_SECONDS:
        return False
    try:
        lock.unlink()
    except OSError:
        return False
    warnings.warn(f"removed a stale kernel build lock ({lock}, {age / 60:.0f} minutes old)",
                  RuntimeWarning, stacklevel=3)
    return True


def _build(cflags: list[str], ldflags: list[str]) -> bool | str:
    """True once the kernels built with these flags are loaded, else why not."""
    name = _build_name(cflags, ldflags)
    where = _cache_dir() / name
    failed = where / "FAILED"  # a failed build is not retried by every process
    if failed.is_file():
        return f"{failed.read_text().strip()}; delete {failed} to try again"
    try:
        from torch.utils import cpp_extension

        where.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(where)
        if not (where / f"{name}.so").exists():  # said while it happens: it takes a while
            print(f"attnlab: building the CPU decoding kernels for this machine, once (about "
                  f"20 s; kept in {where})", file=sys.stderr, flush=True)
        cpp_extension.load(name, [str(f) for f in _SOURCES], extra_cflags=cflags,
                           extra_ldflags=ldflags, build_directory=str(where),
                           is_python_module=False, verbose=False)
        _register_shapes()
    except Exception as error:  # no compiler, no ninja, an unwritable cache: run without them
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        try:
            failed.write_text(first + "\n")
        except OSError:
            pass
        return first
    return True


def _without(why: str) -> bool:
    warnings.warn(f"attnlab's CPU kernels could not be built ({why}); integer layers and "
                  "decoding attention use PyTorch's kernels, slower", RuntimeWarning,
                  stacklevel=3)
    return False


def _register_shapes() -> None:
    """What ``torch.compile`` needs to trace through the kernels: the output's shape
    (``register_fake`` from torch 2.4, ``impl_abstract`` before)."""
    register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    for op in ("attnlab::int8_matmul", "attnlab::int4_matmul", "attnlab::float_matmul",
               "attnlab::bf16_batch_matmul"):
        register(op)(_product_like)
    register("attnlab::decode_attention")(_attention_like)


def _product_like(x: torch.Tensor, codes: torch.Tensor, *rest) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0])


def _attention_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest) -> torch.Tensor:
    return q.new_empty(*q.shape[:-1], v.shape[-1])


__all__ = ["BF16_DOT_ROWS", "FLOAT_DTYPES", "available", "bf16_dot_rows", "hand_over_threads"]
