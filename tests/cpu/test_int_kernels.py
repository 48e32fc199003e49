"""attnlab's integer kernels (attnlab/nn/int_kernels.cpp) against float64 references of the
algorithm cpu/kernels.py states, and their place in a compiled graph."""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from attnlab.cpu import kernels as cpu_kernels

built = pytest.mark.skipif(not cpu_kernels.available(),
                           reason="attnlab's integer kernels could not be built here")


@pytest.mark.skipif(sys.platform != "linux" or not shutil.which(os.environ.get("CXX", "c++")),
                    reason="no C++ compiler here: the fallback is tested in test_quantized.py")
def test_the_kernels_build_wherever_a_compiler_is():
    """A broken kernel source must not pass as "could not be built" (which skips the tests
    below and runs PyTorch's kernels): on Linux with a C++ compiler, they build."""
    assert os.environ.get("ATTNLAB_CPU_KERNELS", "1") == "0" or cpu_kernels.available()


def test_an_unwritable_cache_folder_falls_back_to_the_temporary_one(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(blocked))
    folder = cpu_kernels._cache_dir()
    assert folder.parent.parent == Path(tempfile.gettempdir())
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "fine"))
    assert cpu_kernels._cache_dir() == tmp_path / "fine" / "kernels"


def test_two_copies_of_the_sources_build_in_two_folders(tmp_path, monkeypatch):
    """ninja's build file names the sources by path: two installed copies of attnlab (two
    checkouts, two environments) that shared a build folder would rebuild it in turn."""
    here = cpu_kernels._build_name(["-O3"], [])
    copy = tmp_path / "csrc"
    copy.mkdir()
    for f in cpu_kernels._SOURCES + cpu_kernels._HEADERS:
        (copy / f.name).write_text(f.read_text())
    monkeypatch.setattr(cpu_kernels, "_CSRC", copy)
    monkeypatch.setattr(cpu_kernels, "_SOURCES", [copy / f.name for f in cpu_kernels._SOURCES])
    monkeypatch.setattr(cpu_kernels, "_HEADERS", [copy / f.name for f in cpu_kernels._HEADERS])
    assert cpu_kernels._build_name(["-O3"], []) != here
    assert cpu_kernels._build_name(["-O3", "-mavx2"], []) != cpu_kernels._build_name(["-O3"], [])


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path):
    """torch's build lock names no owner: one left by a build that was killed would make every
    later process wait for ever."""
    lock = tmp_path / "lock"
    lock.write_text("")
    assert not cpu_kernels._clear_stale_lock(tmp_path) and lock.exists()  # a build under way
    old = time.time() - cpu_kernels.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale kernel build lock"):
        assert cpu_kernels._clear_stale_lock(tmp_path)
    assert not lock.exists()
    assert not cpu_kernels._clear_stale_lock(tmp_path)  # none there


def _int8_case(rows, out_features, in_features, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g)
    codes = torch.randint(-127, 128, (out_features, in_features), generator=g, dtype=torch.int8)
    scales = torch.rand(out_features, in_features // group, generator=g) * 0.01 + 1e-4
    w = codes.double() * scales.double().repeat_interleave(group, 1)
    return x, codes, scales, w


@built
@pytest.mark.parametrize("rows, in_features, group", [
    (1, 192, 96), (3, 192, 32), (2, 192, 64), (5, 192, 192),
    (2, 48, 16), (1, 48, 48), (3, 40, 40), (2, 60, 20)])  # tails of 16, 8 and 4 inputs
def test_int8_is_x_times_the_dequantised_matrix_in_float32(rows, in_features, group):
    """Float32 activations: only the order of the sums differs from x · Ŵᵀ."""
    x, codes, scales, w = _int8_case(rows, 40, in_features, group)
    y = torch.ops.attnlab.int8_matmul(x, codes, scales, group)
    ref = x.double() @ w.t()
    magnitude = x.abs().double() @ w.abs().t()
    assert y.dtype == torch.float32 and y.shape == (rows, 40)
    assert ((y.double() - ref).abs() <= 2 ** -20 * magnitude).all()


def _int4_case(rows, out_features, in_features, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g) * torch.logspace(-2, 1, in_features)
    x[0, :32] = 0  # an all-zero chunk: s_x = 0, no division by it
    codes = torch.randint(0, 16, (out_features, in_features), generator=g)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)  # by hand: low first
    scales = (torch.rand(out_features, in_features // group, generator=g) * 0.02 + 1e-3).half()
    offsets = (-torch.rand(out_features, in_features // group, generator=g) * 0.2).half()
    return x, codes, packed, scales, offsets


def _expand(t, group):
    return t.double().repeat_interleave(group, 1)


@built
@pytest.mark.parametrize("rows, group, in_features", [
    (1, 32, 256), (3, 32, 256), (2, 64, 256), (4, 128, 256),
    (1, 32, 576), (2, 64, 576)])  # 18 chunks: the loops' tails (SmolLM2's width)
def test_int4_meets_x_rounded_to_16_bits_per_32_inputs(rows, group, in_features):
    x, codes, packed, scales, offsets = _int4_case(rows, 48, in_features, group)
    y = torch.ops.attnlab.int4_matmul(x, packed, scales, offsets, group)
    assert y.dtype == torch.float32 and y.shape == (rows, 48)
    assert not y.isnan().any()
    sc = codes.double() * _expand(scales, group)  # s · c
    w = sc + _expand(offsets, group)  # Ŵ
    # the algorithm in float64: x̂ = s_x · round(x / s_x) per 32 inputs, s_x = max |x| / 32767
    chunks = x.view(rows, -1, 32)
    top = chunks.abs().amax(-1, keepdim=True)
    inverse = torch.where(top > 0, 32767 / top, torch.zeros_like(top))
    x_hat = ((chunks * inverse).round() * (top / 32767)).view(rows, -1).double()
    algorithm = x_hat @ sc.t() + x.double() @ (w - sc).t()
    magnitude = x.abs().double() @ w.abs().t()
    assert ((y.double() - algorithm).abs() <= 2 ** -18 * magnitude).all()
    # and the bound it promises against the exact x · Ŵᵀ, reached in part (not loose)
    exact = x.double() @ w.t()
    bound = 0.5 * (top / 32767).double().expand(-1, -1, 32).reshape(rows, -1) @ sc.abs().t()
    error = (y.double() - exact).abs()
    assert (error <= bound + 2 ** -18 * magnitude).all()
    assert (error / bound).max() > 0.05


@built
def test_non_finite_and_tiny_inputs_give_nan_rows_and_zeros_not_garbage():
    """An inf or a NaN in a row makes that row's outputs NaN (no undefined cast of NaN to an
    integer); a chunk of inputs below 1e-30 counts as zeros; other rows are unaffected."""
    _, codes, packed, scales, offsets = _int4_case(4, 48, 256, 32)
    x = torch.randn(4, 256)
    x[0, 5], x[1, 200] = float("inf"), float("nan")
    x[2, :32] = 1e-35
    y = torch.ops.attnlab.int4_matmul(x, packed, scales, offsets, 32)
    assert y[:2].isnan().all()
    w = codes.double() * _expand(scales, 32) + _expand(offsets, 32)
    ref = x[2:].double() @ w.t()
    assert torch.allclose(y[2:].double(), ref, rtol=1e-3, atol=1e-3)
    x8, codes8, scales8, _ = _int8_case(2, 16, 64, 32)
    x8[0, 3] = float("nan")
    y8 = torch.ops.attnlab.int8_matmul(x8, codes8, scales8, 32)
    assert y8[0].isnan().all() and y8[1].isfinite().all()


@built
def test_the_kernels_run_inside_a_compiled_graph_with_the_eager_numbers():
    x, codes8, scales8, _ = _int8_case(2, 48, 256, 32)
    _, _, packed, scales4, offsets = _int4_case(2, 48, 256, 32)

    def step(x):
        h = torch.ops.attnlab.int4_matmul(torch.tanh(x), packed, scales4, offsets, 32)
        return torch.ops.attnlab.int8_matmul(x, codes8, scales8, 32) + h.relu()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), step(x))


@built
def test_bad_operands_are_refused_with_the_kernels_name():
    x, codes, scales, _ = _int8_case(1, 16, 64, 32)
    with pytest.raises(RuntimeError, match="attnlab integer kernel: x must be"):
        torch.ops.attnlab.int8_matmul(x.double(), codes, scales, 32)
    with pytest.raises(RuntimeError, match="group must divide"):
        torch.ops.attnlab.int8_matmul(x, codes, scales, 24)
    with pytest.raises(RuntimeError, match="group must divide"):  # not a division by zero
        torch.ops.attnlab.int8_matmul(x, codes, scales, 0)
    with pytest.raises(RuntimeError, match="scales must be float32"):
        torch.ops.attnlab.int8_matmul(x, codes, scales[:, :1], 32)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.attnlab.int4_matmul(torch.randn(1, 64), torch.zeros(16, 32, dtype=torch.uint8),
                                      torch.ones(16, 4).half(), torch.ones(16, 4).half(), 16)
    with pytest.raises(RuntimeError, match="scales must be float16"):
        torch.ops.attnlab.int4_matmul(torch.randn(1, 64), torch.zeros(16, 32, dtype=torch.uint8),
                                      torch.ones(16, 2), torch.ones(16, 2), 32)


@built
@pytest.mark.skipif(sys.platform != "linux" or not shutil.which(os.environ.get("CXX", "c++")),
                    reason="no C++ compiler here")
def test_the_portable_build_gives_the_same_numbers(tmp_path):
    """ARM and other CPUs build the kernels without AVX2 (GCC/Clang vector code): built here
    for ATen's default capability in a fresh process, int8, int4 (its own activation layout
    and unpacking) and the decoding attention agree with this process's build."""
    import subprocess

    g = torch.Generator().manual_seed(7)
    x8, codes8, scales8, _ = _int8_case(3, 40, 576, 32, seed=7)
    x4, _, packed, scales4, offsets = _int4_case(3, 48, 576, 64, seed=7)
    q, k, v = (torch.randn(2, 6, 1, 64, generator=g), torch.randn(2, 2, 40, 64, generator=g),
               torch.randn(2, 2, 40, 64, generator=g))
    allowed = torch.rand(2, 40, generator=g) < 0.6
    ops = torch.ops.attnlab
    operands = dict(x8=x8, codes8=codes8, scales8=scales8, x4=x4, packed=packed,
                    scales4=scales4, offsets=offsets, q=q, k=k, v=v, allowed=allowed)
    torch.save(operands, tmp_path / "operands.pt")
    script = f"""
import torch
from attnlab.cpu import kernels as cpu_kernels
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
assert "-mavx2" not in cpu_kernels._flags()[0] and cpu_kernels.available()
o = torch.load({str(tmp_path / "operands.pt")!r})
ops = torch.ops.attnlab
torch.save(dict(
    int8=ops.int8_matmul(o["x8"], o["codes8"], o["scales8"], 32),
    int4=ops.int4_matmul(o["x4"], o["packed"], o["scales4"], o["offsets"], 64),
    attention=ops.decode_attention(o["q"], o["k"], o["v"], o["allowed"], 0.125)),
    {str(tmp_path / "results.pt")!r})
"""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", ATTNLAB_CACHE_DIR=str(
        cpu_kernels._cache_dir().parent))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = torch.load(tmp_path / "results.pt")
    torch.testing.assert_close(theirs["int8"], ops.int8_matmul(x8, codes8, scales8, 32),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(theirs["int4"], ops.int4_matmul(x4, packed, scales4, offsets, 64),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(theirs["attention"],
                               ops.decode_attention(q, k, v, allowed, 0.125),
                               rtol=1e-5, atol=1e-6)


def test_a_first_build_says_what_it_builds_once(tmp_path, monkeypatch, capsys):
    """The first build on a machine takes a while: one line says so while it runs; a later
    process, which finds the built library, says nothing. (The compiler is stood in for:
    what is checked is the line, not the build.)"""
    from torch.utils import cpp_extension

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_register_shapes", lambda: None)
    built = []

    def fake_load(name, sources, build_directory, **kwargs):
        built.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert cpu_kernels._build(["-O3"], []) is True
    line = capsys.readouterr().err.strip()
    assert line.startswith("attnlab: building the CPU decoding kernels for this machine, once")
    assert str(tmp_path) in line and len(line.splitlines()) == 1
    assert cpu_kernels._build(["-O3"], []) is True and len(built) == 2
    assert capsys.readouterr().err == ""
