"""What the fuzz tests share: the property, the strategies that damage files, and the
writers of valid files. The tests and their docstring are in test_files.py and test_models.py."""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import resource
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from attnlab.config import CHOICES
from attnlab.errors import AttnlabError

EXAMPLES = int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", "25"))
HANG_SECONDS = 20
MEMORY_BOUND = 2**30  # bytes of peak-RSS growth allowed in one example (one read)

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize="ATTNLAB_FUZZ_EXAMPLES" not in os.environ,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TINY_GPT = dict(vocab_size=40, d_model=32, n_heads=2, d_ff=64, n_decoder_layers=1, max_len=32)


# --- the property ------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` field, in KiB (``VmRSS``: resident now, ``VmHWM``: its peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


@contextlib.contextmanager
def bounded_memory(what: str, bound: int = MEMORY_BOUND):
    """Fail unless the block's peak resident memory stays within ``bound`` of what the
    process held when it began. On Linux the peak (``VmHWM``) is reset to the current RSS
    first (``/proc/self/clear_refs``), so the bound holds in a process that reached gigabytes
    earlier (``make test``, after the training tests), and it sees a buffer that was freed
    before the reader returned. Elsewhere only the process-wide ``ru_maxrss`` exists: growth
    above the highest peak so far, weaker after big tests."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS (Documentation/filesystems/proc.rst)
        before = _status_kib("VmRSS") * 1024
        yield
        grown = _status_kib("VmHWM") * 1024 - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # macOS: bytes
        yield
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < bound, (f"{what}: peak memory grew by {grown / 2**20:,.0f} MiB "
                           f"(bound {bound / 2**20:,.0f} MiB)")


def holds(read, *args):
    """``read(*args)``, where an AttnlabError is a fine answer and any other exception fails the
    test; an alarm after HANG_SECONDS fails it too (even if the reader catches the alarm's
    AssertionError and turns it into an AttnlabError), and so does a peak resident memory
    more than ``MEMORY_BOUND`` above what the process held before (:func:`bounded_memory`)."""
    fired = []
    name = getattr(read, "__qualname__", read)

    def on_alarm(signum, frame):
        fired.append(signum)
        raise AssertionError(f"{name} still running after {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_SECONDS)
    try:
        with bounded_memory(str(name)):
            try:
                result = read(*args)
            except AttnlabError as e:
                result = e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired, f"{name} hung (> {HANG_SECONDS} s)"
    return result


@contextlib.contextmanager
def scratch():
    """A fresh temporary folder for one example."""
    with tempfile.TemporaryDirectory(prefix="attnlab-fuzz-") as d:
        yield Path(d)


# --- strategies --------------------------------------------------------------------------------
INTERESTING = [b'"', b"{", b"}", b"[", b"]", b",", b":", b"\n", b"\r\n", b"\\", b"\x00",
               b"\xff", b"\xc3", b"-1", b"1e999", b"NaN", b"null", b"9" * 30, b"\xef\xbb\xbf"]


OPS = ["flip"] * 3 + ["overwrite"] * 2 + ["insert", "duplicate", "truncate"]  # by weight


@st.composite
def mutated(draw, valid: bytes, hot: int = 0, keep: int = 0) -> bytes:
    """``valid`` with 1-8 edits; with ``hot``, half the positions fall in its first ``hot``
    bytes (a header); nine edits in ten spare the first ``keep`` bytes (a magic number)."""
    data = bytearray(valid)
    low = 0 if draw(st.integers(0, 9)) == 0 else keep

    def position(upper: int) -> int:  # low..upper
        if upper <= low:
            return upper
        if low < hot < upper and draw(st.booleans()):
            return draw(st.integers(low, hot))
        return draw(st.integers(low, upper))

    for _ in range(draw(st.integers(1, 8))):
        n = len(data)
        op = draw(st.sampled_from(OPS))
        if op == "flip" and n:
            data[position(n - 1)] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite" and n:
            data[position(n - 1)] = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF])
                                         | st.integers(0, 255))
        elif op == "truncate":
            del data[position(n):]
        elif op == "insert":
            i = position(n)
            data[i:i] = draw(st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=16))
        elif op == "duplicate" and n:
            i = position(n - 1)
            j = draw(st.integers(i + 1, min(n, i + 256)))
            k = position(n)
            data[k:k] = data[i:j]
    return bytes(data)


def damaged(valid: bytes, hot: int = 0, keep: int = 0):
    """The valid file mutated (three times in four), or plain random bytes."""
    edits = mutated(valid, hot, keep)
    return st.one_of(edits, edits, edits, st.binary(max_size=4096))


# JSON values that stand for text no json.dumps writes: an integer beyond Python's 4,300-digit
# limit, and nesting far beyond the recursion limit.
HUGE_INT, DEEP = "\x00huge-int\x00", "\x00deep\x00"
RAW = {json.dumps(HUGE_INT): "9" * 5000, json.dumps(DEEP): "[" * 100_000 + "]" * 100_000}
CHOICE_STRINGS = sorted({c for values in CHOICES.values() for c in values})

json_ints = st.integers() | st.sampled_from(
    [0, -1, 1, 2, 2**31, -(2**31), 2**40, 2**63, -(2**63) - 1, 2**64, 10**30, 10**300, HUGE_INT])
json_floats = st.floats() | st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e-300])
json_texts = st.text(max_size=12) | st.sampled_from(CHOICE_STRINGS)
json_values = st.recursive(
    st.none() | st.booleans() | json_ints | json_floats | json_texts | st.just(DEEP),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=8,
)


def _same_kind(value):
    """Drawn values of ``value``'s own JSON type (a size stays a number, but any number)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return json_ints
    if isinstance(value, float):
        return json_floats | json_ints
    if isinstance(value, str):
        return json_texts
    return json_values


def _edit(draw, node):
    """``node`` with one value somewhere inside replaced by a drawn JSON value (half the time
    one of the same type) or deleted."""
    if not isinstance(node, (dict, list)) or not node or draw(st.integers(0, 3)) == 0:
        return draw(_same_kind(node) if draw(st.booleans()) else json_values)
    if isinstance(node, dict):
        key = draw(st.sampled_from(sorted(node)))
        if draw(st.integers(0, 5)) == 0:
            del node[key]
        else:
            node[key] = _edit(draw, node[key])
    else:
        i = draw(st.integers(0, len(node) - 1))
        node[i] = _edit(draw, node[i])
    return node


@st.composite
def replaced(draw, valid: bytes) -> bytes:
    """The valid JSON document with 1-3 values replaced or deleted (rarely the whole of it)."""
    doc = json.loads(valid)
    if draw(st.integers(0, 9)) == 0:
        doc = draw(json_values)
    else:
        for _ in range(draw(st.integers(1, 3))):
            doc = _edit(draw, copy.deepcopy(doc))
    text = json.dumps(doc)
    for marker, raw in RAW.items():
        text = text.replace(marker, raw)
    return text.encode()


def json_inputs(valid: bytes):
    """A JSON file damaged as bytes, or as a document."""
    return damaged(valid) | replaced(valid)


# --- valid files, written once per session -----------------------------------------------------
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "ab ab abc, hello!"]


class Files(dict):
    """Valid files by name; printed by name only in a failing example."""

    def __repr__(self) -> str:
        return f"<valid files: {', '.join(self)}>"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def safetensors_header(blob: bytes) -> int:
    """Bytes of a safetensors file's header (its 8-byte length and the JSON)."""
    return 8 + int.from_bytes(blob[:8], "little")


def put(folder: Path, files: dict[str, bytes]) -> Path:
    for name, blob in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(blob)
    return folder


# --- 4. GGUF -----------------------------------------------------------------------------------
GGUF_TOKENS = ["<|endoftext|>", "a", "b", "c", "e", "h", "l", "o", "Ġ", ".", "!", "ab", "he",
               "ll", "lo", "Ġa", "Ġh", "hel", "hell", "hello"]
GGUF_MERGES = ["h e", "he l", "hel l", "hell o", "Ġ a", "a b", "Ġ h", "l l", "l o"]
GGUF_D, GGUF_FF = 16, 32
GGUF_SHAPES = {  # attnlab's (out, in)
    "token_embd.weight": (len(GGUF_TOKENS), GGUF_D), "output_norm.weight": (GGUF_D,),
    **{f"blk.0.{kind}.weight": shape for kind, shape in [
        ("attn_norm", (GGUF_D,)), ("attn_q", (GGUF_D, GGUF_D)), ("attn_k", (GGUF_D, GGUF_D)),
        ("attn_v", (GGUF_D, GGUF_D)), ("attn_output", (GGUF_D, GGUF_D)), ("ffn_norm", (GGUF_D,)),
        ("ffn_gate", (GGUF_FF, GGUF_D)), ("ffn_up", (GGUF_FF, GGUF_D)),
        ("ffn_down", (GGUF_D, GGUF_FF))]},
}


def gguf_metadata() -> dict[str, tuple]:
    """The tiny file's metadata: key -> (value, GGUFValueType[, array item type])."""
    from gguf import GGUFValueType as T

    return {
        "general.architecture": ("llama", T.STRING),
        "llama.context_length": (64, T.UINT32), "llama.embedding_length": (GGUF_D, T.UINT32),
        "llama.block_count": (1, T.UINT32), "llama.feed_forward_length": (GGUF_FF, T.UINT32),
        "llama.attention.head_count": (2, T.UINT32),
        "llama.attention.head_count_kv": (2, T.UINT32),
        "llama.rope.freq_base": (10000.0, T.FLOAT32),
        "llama.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32),
        "tokenizer.ggml.model": ("gpt2", T.STRING),
        "tokenizer.ggml.tokens": (GGUF_TOKENS, T.ARRAY, T.STRING),
        "tokenizer.ggml.merges": (GGUF_MERGES, T.ARRAY, T.STRING),
        "tokenizer.ggml.bos_token_id": (0, T.UINT32), "tokenizer.ggml.eos_token_id": (0, T.UINT32),
    }


def write_tiny_gguf(path: Path, metadata: dict | None = None, tensors: dict | None = None):
    """A Llama GGUF file: d_model 16, 2 heads, d_ff 32, one block, 20 byte-level BPE tokens;
    F32 tensors in attnlab's (out, in) shape. ``metadata`` replaces (or, with None, leaves out)
    entries of :func:`gguf_metadata`; ``tensors`` maps a name to ``(shape, dtype)`` (or None:
    left out)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.kv_data[0].clear()  # the writer's own general.architecture: ours is in the metadata
    for key, entry in {**gguf_metadata(), **(metadata or {})}.items():
        if entry is not None:
            w.add_key_value(key, *entry)
    rng = np.random.default_rng(0)
    specs = {name: (shape, np.float32) for name, shape in GGUF_SHAPES.items()}
    for name, spec in {**specs, **(tensors or {})}.items():
        if spec is not None:
            shape, dtype = spec
            value = np.ones(shape) if len(shape) == 1 else rng.normal(0, 0.1, shape)
            w.add_tensor(name, value.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_values():
    """A metadata value of any GGUF type: ``(value, type[, array item type])``."""
    from gguf import GGUFValueType as T

    def typed(values, kind):
        return values.map(lambda v: (v, kind))

    small = st.integers(0, 100) | st.sampled_from([2**16, 2**24, 2**31, 2**32 - 1])
    return st.one_of(
        typed(small, T.UINT32), typed(st.integers(0, 2**32 - 1), T.UINT32),
        typed(st.integers(-(2**31), 2**31 - 1), T.INT32),
        typed(st.integers(0, 2**64 - 1), T.UINT64),
        typed(st.integers(-(2**63), 2**63 - 1), T.INT64),
        typed(st.floats(width=32), T.FLOAT32), typed(st.floats(), T.FLOAT64),
        typed(st.booleans(), T.BOOL), typed(st.text(max_size=12), T.STRING),
        st.lists(st.text(max_size=8), min_size=1, max_size=30).map(
            lambda v: (v, T.ARRAY, T.STRING)),
        st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=8).map(
            lambda v: (v, T.ARRAY, T.UINT32)),
    )


GGUF_EXTRA_TENSORS = ["output.weight", "blk.1.attn_q.weight", "blk.0.bogus.weight",
                      "blk.x.attn_q.weight", "token_embd"]


@st.composite
def gguf_edits(draw) -> tuple[dict, dict]:
    """Metadata entries replaced by values of any type or left out, and tensors left out,
    reshaped, stored as float16 or added."""
    keys = draw(st.lists(st.sampled_from(sorted(gguf_metadata())), max_size=3, unique=True))
    metadata = {k: None if draw(st.integers(0, 5)) == 0 else draw(gguf_values()) for k in keys}
    names = draw(st.lists(st.sampled_from(sorted(GGUF_SHAPES) + GGUF_EXTRA_TENSORS),
                          min_size=0 if metadata else 1, max_size=2, unique=True))
    tensors = {}
    for name in names:
        shape = st.just(GGUF_SHAPES.get(name, (len(GGUF_TOKENS), GGUF_D)))
        shape |= st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple)
        tensors[name] = draw(st.none() | st.tuples(shape, st.sampled_from([np.float32,
                                                                            np.float16])))
    return metadata, tensors


# --- 7. JSON lines -----------------------------------------------------------------------------
@st.composite
def jsonl_inputs(draw, valid: bytes) -> bytes:
    """Damaged bytes, or valid lines with one line's object fuzzed as a JSON document."""
    if draw(st.booleans()):
        return draw(damaged(valid))
    lines = valid.splitlines(keepends=True)
    i = draw(st.integers(0, len(lines) - 1))
    lines[i] = draw(replaced(lines[i])).replace(b"\n", b" ") + b"\n"
    return b"".join(lines)


def gzipped(blobs):
    """Damaged plain bytes, compressed; or damaged compressed bytes."""
    return st.one_of(blobs.map(gzip.compress),
                     blobs.flatmap(lambda b: damaged(gzip.compress(b, mtime=0), keep=3)))
