"""Where attnlab runs and in which precision: the one place that decides.

* **device** ``auto``: CUDA, then Apple's MPS, then the CPU.
* **precision** ``auto``: bf16 where the hardware runs it natively *and* faster than fp32
  (a CPU with AMX, AVX512-BF16 or ARM BF16 whose bf16 matrix product was measured faster; a
  CUDA GPU that supports bf16); fp16 with dynamic loss scaling on a CUDA GPU without bf16;
  fp32 everywhere else. On a CPU without native bf16, bf16 is emulated, many times *slower*
  than fp32 (docs/benchmarks.md), so it is never chosen there.

Native bf16 on a CPU is decided in two steps: the instruction-set flags must list it, and a
short bf16 vs fp32 matrix-product timing (run once in a child process, cached per machine in
``~/.cache/attnlab``) must show it faster. The child process also catches a CPU that lists
AMX while the system does not enable it (seen in virtual machines): AMX instructions then die
with SIGILL, so oneDNN is kept below AMX for this process (``ONEDNN_MAX_CPU_ISA``) and bf16
runs, slowly, instead of killing the program.

Overrides, so both branches can be tested on one machine: ``ATTNLAB_NATIVE_BF16=0|1`` replaces
the detection (``ATTNLAB_NATIVE_INT8=0|1`` that of :func:`cpu_int8`);
``ATTNLAB_PRECISION=auto|fp32|bf16|fp16`` is the default of ``--precision``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from attnlab.errors import BadInput

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 /proc/cpuinfo names
MIN_SPEEDUP = 1.2  # bf16 matmul / fp32 matmul speed needed to call bf16 "native and faster"


@dataclass(frozen=True)
class Support:
    """Whether the CPU runs bf16 natively and faster than fp32, and why."""

    native: bool
    reason: str


# --- the CPU ---------------------------------------------------------------------------------
@cache
def cpu_flags() -> tuple[str, frozenset[str]]:
    """``(model name, instruction-set flags)`` of this CPU (Linux /proc/cpuinfo, macOS
    sysctl); empty flags where neither can be read."""
    model, flags = "", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and value.strip():
            model = value.strip()
        elif key in ("flags", "features"):  # x86 "flags", ARM "Features"
            flags.update(value.split())
    if sys.platform == "darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
        if _sysctl("hw.optional.arm.FEAT_BF16") == "1":
            flags.add("bf16")
    return model or platform.processor() or platform.machine(), frozenset(flags)


def _sysctl(name: str) -> str | None:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def isa_summary(flags: frozenset[str]) -> str:
    """The flags that matter for matrix work, most capable first."""
    names = ("amx_bf16", "amx_fp16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni",
             "avx512f", "avx_vnni", "avx2", "fma", "bf16", "i8mm", "sve", "asimd")
    return " ".join(n for n in names if n in flags) or "none of note"


def _cache_file() -> Path | None:
    """``$ATTNLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME``, else ``~/.cache``; None without a
    home directory (nothing is cached then)."""
    root = os.environ.get("ATTNLAB_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    try:
        return (Path(root) if root else Path.home() / ".cache") / "attnlab" / "hardware.json"
    except RuntimeError:
        return None


# The probe: one bf16 and one fp32 matrix product of a training-sized shape, timed in turn.
# It runs in a child process so that an instruction the system does not enable (SIGILL) ends
# the child, not attnlab.
_PROBE = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.randn(1024, 512), torch.randn(512, 512)
pairs = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
best = {k: float("inf") for k in pairs}
for _ in range(6):
    for k, (x, y) in pairs.items():
        start = time.perf_counter()
        for _ in range(4):
            x @ y
        best[k] = min(best[k], (time.perf_counter() - start) / 4)
print(json.dumps(best))
"""


def _run_probe(env: dict[str, str]) -> dict:
    """``{"fp32": s, "bf16": s}``, or ``{"crashed": signal}`` / ``{"error": why}``."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, str(thread_count())],
                           capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"probe could not run ({e})"}
    if r.returncode < 0:
        return {"crashed": -r.returncode}
    try:
        timings = json.loads(r.stdout.strip().splitlines()[-1])
        return {"fp32": float(timings["fp32"]), "bf16": float(timings["bf16"])}
    except (IndexError, ValueError, KeyError, TypeError):
        return {"error": (r.stderr.strip().splitlines() or ["probe failed"])[-1]}


@cache
def probe() -> dict:
    """Timings of bf16 and fp32 matmul on this CPU (seconds), measured once per machine,
    torch version and ISA settings, and cached. ``amx_cap`` is set when AMX died with SIGILL
    and the timings were taken with oneDNN kept below it."""
    model, flags = cpu_flags()
    key = "|".join([model, isa_summary(flags), torch.__version__, str(thread_count()),
                    *(f"{k}={os.environ.get(k, '')}" for k in (
                        "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"))])
    path = _cache_file()
    try:
        stored = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        stored = {}
    stored = stored if isinstance(stored, dict) else {}
    if isinstance(stored.get(key), dict) and "fp32" in stored[key]:
        return stored[key]
    result = _run_probe(dict(os.environ))
    if result.get("crashed") == signal.SIGILL and "amx_tile" in flags:
        cap = "AVX512_CORE_BF16" if "avx512_bf16" in flags else "AVX512_CORE"
        result = {**_run_probe({**os.environ, "ONEDNN_MAX_CPU_ISA": cap}), "amx_cap": cap}
    if path and "fp32" in result:  # only measurements are kept: a failure is tried again
        with contextlib.suppress(OSError):  # not writable: measure again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")  # then an atomic rename
            tmp.write_text(json.dumps({**stored, key: result}, indent=1))
            tmp.replace(path)
    return result


def guard_amx() -> str | None:
    """On a CPU that lists AMX, make sure AMX instructions run; if they die with SIGILL, keep
    oneDNN below AMX for this process. Must run before torch's first bf16 matrix product
    (``import attnlab`` calls it). Returns the cap set, if any."""
    if (sys.platform != "linux" or os.environ.get("ONEDNN_MAX_CPU_ISA")
            or os.environ.get("DNNL_MAX_CPU_ISA") or "amx_tile" not in cpu_flags()[1]):
        return None
    cap = probe().get("amx_cap")
    if cap:
        os.environ["ONEDNN_MAX_CPU_ISA"] = cap
    return cap


def cpu_bf16() -> Support:
    """Native (and faster than fp32) bf16 on this CPU, with the reason for the answer."""
    forced = os.environ.get("ATTNLAB_NATIVE_BF16")
    if forced in ("0", "1"):
        return Support(forced == "1", f"forced by ATTNLAB_NATIVE_BF16={forced}")
    flags = cpu_flags()[1]
    listed = [f for f in (*BF16_FLAGS, "bf16") if f in flags]
    if not listed:
        return Support(False, "the CPU lists no AMX-BF16, AVX512-BF16 or ARM BF16 instructions")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if cap and not any(s in cap.upper() for s in ("BF16", "AMX", "FP16", "DEFAULT", "ALL")):
        return Support(False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN off the bf16 instructions")
    result = probe()
    if "fp32" not in result:
        what = (f"a bf16 matrix product died with signal {result['crashed']}"
                if "crashed" in result else result.get("error", "the probe failed"))
        return Support(False, f"{'/'.join(listed)} listed, but {what}")
    speedup = result["fp32"] / result["bf16"]
    note = (f"; AMX is listed but dies with SIGILL (not enabled by the system), so oneDNN is "
            f"kept to {result['amx_cap']}" if result.get("amx_cap") else "")
    verdict = "faster" if speedup >= MIN_SPEEDUP else "not faster"
    return Support(speedup >= MIN_SPEEDUP, f"{'/'.join(listed)} listed; bf16 matmul measured "
                   f"{speedup:.2f}x fp32, {verdict}{note}")


INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "i8mm", "asimddp")  # x86, then ARM


def cpu_int8() -> Support:
    """Fast int8 × int8 dot products on this CPU (VNNI or AMX-INT8 on x86, the dot-product or
    i8mm instructions on ARM), which dynamic int8 activations need to beat float."""
    forced = os.environ.get("ATTNLAB_NATIVE_INT8")
    if forced in ("0", "1"):
        return Support(forced == "1", f"forced by ATTNLAB_NATIVE_INT8={forced}")
    listed = [f for f in INT8_FLAGS if f in cpu_flags()[1]]
    if not listed:
        return Support(False, "the CPU lists no VNNI, AMX-INT8 or ARM int8 dot-product "
                              "instructions")
    return Support(True, f"{'/'.join(listed)} listed")


def thread_count() -> int:
    """The CPUs this process may use (its affinity mask), not the host's core count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def use_threads() -> int:
    """Size torch's intra-op pool to the CPUs this process may use: torch's default counts the
    host's cores, which oversubscribes a process pinned to fewer (a container, taskset,
    a scheduler's slot). Never more than that default (physical cores, on SMT machines), and
    OMP_NUM_THREADS / MKL_NUM_THREADS, when set, are left to decide."""
    if not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")):
        torch.set_num_threads(max(1, min(thread_count(), torch.get_num_threads())))
    return torch.get_num_threads()


# --- device and precision ----------------------------------------------------------------
def available_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes of memory this process may still allocate: free memory on a CUDA ``device``;
    otherwise the system's available memory (``MemAvailable``), capped by a cgroup v2 limit
    (containers; reclaimable page cache counted as free); None where unknown."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            stat = dict(line.split() for line in
                        Path("/sys/fs/cgroup/memory.stat").read_text().splitlines())
            used -= int(stat.get("inactive_file", 0))  # page cache the kernel can drop
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def mps_available() -> bool:
    """Apple's Metal backend is built in and usable on this machine."""
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA (this process's LOCAL_RANK under torchrun), then MPS, then CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BadInput(f"--device {name}: expected auto, cpu, cuda[:N] or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"--device {name}: CUDA is not available to this torch build")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    elif device.type == "mps" and not mps_available():
        raise BadInput(f"--device {name}: Apple MPS is not available")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise BadInput(f"--device {name}: expected auto, cpu, cuda[:N] or mps")
    return device


def cuda_bf16(device: torch.device | int) -> bool:
    """Native bf16 on this GPU: Ampere (compute capability 8.0) or later.
    ``torch.cuda.is_bf16_supported()`` also answers yes for emulated bf16 (a T4 or V100),
    where fp16 is the fast half precision."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def precision_name(name: str | None) -> str:
    """What was asked for: ``name``, else ``$ATTNLAB_PRECISION``, else ``auto``."""
    name = name or os.environ.get("ATTNLAB_PRECISION") or "auto"
    if name not in PRECISIONS:
        raise BadInput(f"precision {name!r}: expected one of {', '.join(PRECISIONS)}")
    return name


def auto_precision(device: torch.device) -> tuple[str, str]:
    """``(precision, why)`` that ``auto`` means on ``device``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if cuda_bf16(device):
            return "bf16", f"{name} runs bf16 natively (compute capability 8.0 or later)"
        return "fp16", f"{name} has no native bf16: fp16 with dynamic loss scaling"
    if device.type == "cpu":
        support = cpu_bf16()
        return ("bf16" if support.native else "fp32"), support.reason
    return "fp32", f"{device.type}: fp32"


_warned: set[str] = set()


def pick_precision(name: str | None, device: torch.device, warn: bool = True) -> str:
    """The precision to run in: ``name`` (None: ``ATTNLAB_PRECISION``, else ``auto``)
    resolved for ``device``. An explicit bf16/fp16 on a CPU without native support runs, after
    a one-line warning with the expected slowdown."""
    name = precision_name(name)
    if name == "auto":
        return auto_precision(device)[0]
    if warn and device.type == "cpu" and name != "fp32" and name not in _warned:
        message = _slow_on_cpu(name)
        if message:
            _warned.add(name)  # once a process: the CLI and the trainer both resolve it
            warnings.warn(message, stacklevel=2)
    return name


def _slow_on_cpu(name: str) -> str | None:
    """Why ``name`` will be slow on this CPU, or None if it will not."""
    if name == "fp16":
        return ("fp16 requested on a CPU: most CPUs run it slower than fp32 (it is meant for "
                "GPUs without bf16); --precision auto picks what this machine runs fastest")
    support = cpu_bf16()
    if support.native:
        return None
    timing = probe() if not os.environ.get("ATTNLAB_NATIVE_BF16") else {}
    if "fp32" in timing:
        ratio = timing["bf16"] / timing["fp32"]
        slow = (f"{ratio:.1f}x slower than fp32" if ratio >= 1 else
                f"only {1 / ratio:.2f}x faster than fp32") + " in a measured matrix product"
    else:
        slow = "up to ~12x slower than fp32 (measured on an AVX2 CPU)"
    return (f"bf16 requested, but this CPU has no native bf16 ({support.reason}): expect it "
            f"to run {slow}")


def autocast(device: torch.device, precision: str):
    """Mixed precision for a forward pass: fp32 weights, bf16/fp16 matrix products (and fp32
    where autocast keeps it: softmax, norms, losses). fp32 enters no autocast at all."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def grad_scaler(device: torch.device, precision: str):
    """fp16 needs dynamic loss scaling (starting at 2^15) against gradient underflow; bf16 and
    fp32 have fp32's exponent range and need none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, init_scale=2.0**15)


def weights_on(model: torch.nn.Module) -> tuple[torch.device, str]:
    """``(device, precision name)`` of ``model``'s weights: where and in what its forward pass
    runs when no autocast is applied."""
    weight = next(model.parameters())
    names = {dtype: name for name, dtype in DTYPES.items()}
    return weight.device, names.get(weight.dtype, str(weight.dtype))


def describe(device_name: str = "auto") -> list[str]:
    """What was detected, for ``attnlab info --hardware`` and the benchmarks' headers; the last
    line is ``auto precision: <choice>``."""
    model, flags = cpu_flags()
    support = cpu_bf16()
    lines = [f"cpu:              {model} ({platform.machine()}, {thread_count()} usable of "
             f"{os.cpu_count()} logical CPUs)",
             f"isa:              {isa_summary(flags)}; torch kernels "
             f"{torch.backends.cpu.get_cpu_capability()}",
             f"native bf16:      {'yes' if support.native else 'no'} ({support.reason})",
             f"threads:          {torch.get_num_threads()}",
             f"torch:            {torch.__version__}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            lines.append(f"gpu {i}:            {torch.cuda.get_device_name(i)} (native bf16 "
                         f"{'yes' if cuda_bf16(i) else 'no'})")
    else:
        lines.append(f"gpu:              none{' (MPS available)' if mps_available() else ''}")
    device = pick_device(device_name)
    precision, why = auto_precision(device)
    lines.append(f"device:           {device}")
    if device.type != "cpu":  # the CPU's reason is the native-bf16 line above
        lines.append(f"why:              {why}")
    return [*lines, f"auto precision: {precision}"]


def report() -> str:
    """The hardware block every benchmark prints first."""
    return "hardware\n" + "\n".join(f"  {line}" for line in describe()) + "\n"
