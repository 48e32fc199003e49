"""attnlab.hardware: each branch of the device and precision decision, forced on one machine
(native bf16 yes/no, a CUDA GPU with and without bf16, mocked where none is present), the
cached probe, the AMX guard, threads, and the CLI's view of it."""

import os
import warnings

import pytest
import torch

from attnlab import hardware
from attnlab.cli import main

AVX2_ONLY = frozenset("fpu sse sse2 avx fma avx2".split())
ZEN4 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
SAPPHIRE = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A CPU with the given flags and bf16/fp32 matmul timings (None: the probe crashes)."""
    monkeypatch.delenv("ATTNLAB_NATIVE_BF16", raising=False)
    monkeypatch.delenv("ATTNLAB_PRECISION", raising=False)
    # "" reads as unset, and unlike delenv it is undone even where the variable was absent
    # (guard_amx sets it, and it must not leak into later tests or their child processes)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "")
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hardware, "_warned", set())
    hardware.probe.cache_clear()
    runs = []

    def make(flags, timings=None, crash_without_cap=False):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: ("Test CPU", flags))

        def run_probe(env):
            runs.append(env.get("ONEDNN_MAX_CPU_ISA") or None)
            if crash_without_cap and not env.get("ONEDNN_MAX_CPU_ISA"):
                return {"crashed": 4}  # SIGILL
            return dict(timings) if timings else {"crashed": 4}

        monkeypatch.setattr(hardware, "_run_probe", run_probe)
        return runs

    yield make
    hardware.probe.cache_clear()


def test_avx2_cpu_has_no_native_bf16_and_auto_is_fp32(machine):
    runs = machine(AVX2_ONLY)
    support = hardware.cpu_bf16()
    assert not support.native and "lists no AMX-BF16, AVX512-BF16 or ARM BF16" in support.reason
    assert hardware.pick_precision("auto", torch.device("cpu")) == "fp32"
    assert runs == []  # no flags, no probe


def test_bf16_listed_and_measured_faster_is_native(machine):
    machine(ZEN4, {"fp32": 1.0, "bf16": 0.4})
    support = hardware.cpu_bf16()
    assert support.native and "2.50x fp32, faster" in support.reason
    assert hardware.pick_precision(None, torch.device("cpu")) == "bf16"


def test_bf16_listed_but_measured_slower_is_not_native(machine):
    machine(ZEN4, {"fp32": 1.0, "bf16": 1.6})
    support = hardware.cpu_bf16()
    assert not support.native and "0.62x fp32, not faster" in support.reason
    assert hardware.pick_precision("auto", torch.device("cpu")) == "fp32"


def test_onednn_capped_below_bf16_is_not_native(machine, monkeypatch):
    runs = machine(SAPPHIRE, {"fp32": 1.0, "bf16": 0.3})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    support = hardware.cpu_bf16()
    assert not support.native and "ONEDNN_MAX_CPU_ISA=AVX2" in support.reason
    assert runs == []


@pytest.mark.parametrize("forced, expected", [("1", "bf16"), ("0", "fp32")])
def test_forced_detection_overrides(machine, monkeypatch, forced, expected):
    machine(AVX2_ONLY if forced == "1" else SAPPHIRE, {"fp32": 1.0, "bf16": 0.3})
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", forced)
    assert hardware.cpu_bf16().reason == f"forced by ATTNLAB_NATIVE_BF16={forced}"
    assert hardware.pick_precision("auto", torch.device("cpu")) == expected


def test_attnlab_precision_sets_the_default(machine, monkeypatch):
    machine(AVX2_ONLY)
    monkeypatch.setenv("ATTNLAB_PRECISION", "fp32")
    assert hardware.pick_precision(None, torch.device("cpu")) == "fp32"
    assert hardware.pick_precision("auto", torch.device("cpu")) == "fp32"
    with pytest.raises(ValueError, match="precision 'fp64': expected one of auto, fp32"):
        hardware.pick_precision("fp64", torch.device("cpu"))


def test_explicit_bf16_without_native_support_warns_with_the_slowdown(machine):
    machine(ZEN4, {"fp32": 1.0, "bf16": 3.0})
    with pytest.warns(UserWarning, match=r"bf16 requested.*3\.0x slower than fp32"):
        assert hardware.pick_precision("bf16", torch.device("cpu")) == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process, not at every call
        assert hardware.pick_precision("bf16", torch.device("cpu")) == "bf16"


def test_explicit_bf16_with_native_support_is_silent(machine, recwarn):
    machine(ZEN4, {"fp32": 1.0, "bf16": 0.4})
    assert hardware.pick_precision("bf16", torch.device("cpu")) == "bf16"
    assert not [w for w in recwarn if "bf16" in str(w.message)]


def test_probe_is_cached_per_machine(machine):
    runs = machine(ZEN4, {"fp32": 1.0, "bf16": 0.5})
    first = hardware.probe()
    hardware.probe.cache_clear()  # a new process: only the file remains
    assert hardware.probe() == first and len(runs) == 1
    assert (hardware._cache_file()).exists()


def test_amx_that_dies_with_sigill_caps_onednn(machine):
    runs = machine(SAPPHIRE, {"fp32": 1.0, "bf16": 1.6}, crash_without_cap=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hardware.sys, "platform", "linux")
        assert hardware.guard_amx() == "AVX512_CORE_BF16"
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    assert runs == [None, "AVX512_CORE_BF16"]  # crashed, then measured below AMX
    support = hardware.cpu_bf16()
    assert not support.native and "dies with SIGILL" in support.reason


def test_working_amx_is_left_alone(machine):
    machine(SAPPHIRE, {"fp32": 1.0, "bf16": 0.3})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hardware.sys, "platform", "linux")
        assert hardware.guard_amx() is None and not os.environ["ONEDNN_MAX_CPU_ISA"]
    assert hardware.cpu_bf16().native


@pytest.fixture
def gpu(monkeypatch):
    """A mocked CUDA GPU of the given compute capability (no GPU is lent to CI)."""
    def make(capability, name):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
        # what transformers and torch.amp ask: yes even where bf16 is only emulated
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    return make


def test_cuda_with_bf16(gpu, monkeypatch):
    gpu((9, 0), "H200")
    monkeypatch.setenv("LOCAL_RANK", "1")
    device = hardware.pick_device("auto")
    assert device == torch.device("cuda", 1)  # this torchrun rank's GPU
    precision, why = hardware.auto_precision(device)
    assert precision == "bf16" and "H200 runs bf16 natively" in why
    assert hardware.grad_scaler(device, precision) is None


def test_cuda_without_native_bf16_is_fp16_with_loss_scaling(gpu):
    gpu((7, 5), "Tesla T4")  # is_bf16_supported() says yes: emulated
    device = hardware.pick_device("cuda")
    precision, why = hardware.auto_precision(device)
    assert precision == "fp16" and "T4 has no native bf16" in why and "loss scaling" in why
    scaler = hardware.grad_scaler(torch.device("cpu"), precision)
    assert scaler.get_scale() == 2.0**15


def test_device_errors_name_the_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda: CUDA is not available"):
        hardware.pick_device("cuda")
    with pytest.raises(ValueError, match="--device tpu"):
        hardware.pick_device("tpu")
    if not hardware.mps_available():
        assert hardware.pick_device("auto") == torch.device("cpu")


def test_threads_follow_the_affinity_mask(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(64)  # a host with many cores, of which this process may use few
        assert hardware.use_threads() == hardware.thread_count()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("forced, expected", [("1", "bf16"), ("0", "fp32")])
def test_info_hardware_ends_with_the_auto_choice(monkeypatch, capsys, forced, expected):
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", forced)
    assert main(["info", "--hardware", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"auto precision: {expected}"
    assert any(line.startswith("native bf16:") for line in lines)
    assert any(line.startswith("threads:") for line in lines)
