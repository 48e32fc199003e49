"""Property-based fuzzing of every reader of user files in attnlab.

The property: given mutated or random bytes where a user file belongs, each reader either
returns normally or raises an :class:`attnlab.errors.AttnlabError` (the command line turns it
into one line naming the file) -- never another exception type, never a hang, never large
memory. Concretely, for each reader:

* no exception other than an ``AttnlabError`` escapes (the tests catch nothing else);
* no example runs longer than ``HANG_SECONDS`` (20 s, a ``SIGALRM`` that fails the test even
  if the reader swallows the ``AssertionError`` it raises; it interrupts Python code, so a loop
  inside a C or Rust extension would only be caught when it returns);
* the peak resident memory of the process (``ru_maxrss``) grows by less than
  ``MEMORY_BOUND`` = 1 GB over each test function, all its examples together (a peak, so it
  sees any allocation above what the process had already reached).

Readers covered (each test below runs ``EXAMPLES`` examples, 25 by default):

1. ``ModelConfig.from_json`` on an attnlab ``config.json``;
2. ``attnlab.tokenizers.load`` on an attnlab tokenizer JSON, ``BPETokenizer.from_file`` on a
   Hugging Face ``tokenizer.json``;
3. ``WordPieceTokenizer.from_file`` on a ``vocab.txt``, on a folder whose
   ``tokenizer_config.json`` is damaged, and on a folder with a WordPiece ``tokenizer.json``;
4. ``attnlab.interop.gguf.load_gguf`` on a tiny Llama GGUF file: its bytes mutated (header,
   metadata, tensor infos, data), and the file rewritten with metadata entries of any GGUF
   type or left out, and tensors left out, reshaped, in float16 or added;
5. ``attnlab.storage.load`` on an attnlab model folder (``model.safetensors``, ``config.json``,
   ``tokenizers.json``, one damaged at a time) and on a Hugging Face folder whose
   ``tokenizer.json`` is damaged;
6. ``load_trainer_state`` on a ``trainer_state.pt``;
7. ``attnlab.data.classify.read_labelled`` on JSON lines, plain and ``.gz``;
8. ``read_parallel``, ``read_lines`` (plain and ``.gz``) and ``read_text``;
9. ``attnlab.interop.from_pretrained`` on a GPT-2-style Hugging Face folder (``config.json``,
   ``model.safetensors``, or a sharded folder's ``model.safetensors.index.json``).

attnlab has no CoNLL reader yet, so there is nothing to fuzz for it.

Inputs: the valid file with 1-8 edits (a byte flipped or overwritten, a truncation, drawn bytes
inserted, a slice duplicated; positions favour the header where the format has one), or plain
random bytes; JSON files also get structured fuzz: the valid document with fields replaced by
drawn JSON values (null, booleans, huge and negative integers, integers of 5,000 digits, NaN
and infinities, text, lists, dicts, nesting 100,000 deep; half the time a value of the field's
own type) or deleted. Known damage that the examples reach only now and then is pinned in the
``test_known_*`` tests at the end, each of which once escaped or allocated gigabytes.

``ATTNLAB_FUZZ_EXAMPLES=N`` sets the examples per test (default 25) and, when set, draws new
random examples on each run; by default the examples are the same on every run.
"""

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
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from attnlab import ModelConfig, build_model, save_pretrained
from attnlab.config import CHOICES
from attnlab.errors import AttnlabError

EXAMPLES = int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", "25"))
HANG_SECONDS = 20
MEMORY_BOUND = 2**30  # bytes of peak-RSS growth allowed over one test function

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize="ATTNLAB_FUZZ_EXAMPLES" not in os.environ,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TINY_GPT = dict(vocab_size=40, d_model=32, n_heads=2, d_ff=64, n_decoder_layers=1, max_len=32)


# --- the property ------------------------------------------------------------------------------
def _peak_rss() -> int:
    """The process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@pytest.fixture(autouse=True)
def _bounded_memory():
    """Each test function, all its examples together, grows the peak RSS by < 1 GB."""
    before = _peak_rss()
    yield
    grown = _peak_rss() - before
    assert grown < MEMORY_BOUND, f"peak memory grew by {grown / 2**20:.0f} MiB"


def holds(read, *args):
    """``read(*args)``, where an AttnlabError is a fine answer and any other exception fails the
    test; an alarm after HANG_SECONDS fails it too (even if the reader catches the alarm's
    AssertionError and turns it into an AttnlabError)."""
    fired = []

    def on_alarm(signum, frame):
        fired.append(signum)
        raise AssertionError(f"{getattr(read, '__qualname__', read)} still running after "
                             f"{HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_SECONDS)
    try:
        try:
            result = read(*args)
        except AttnlabError as e:
            result = e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired, f"{getattr(read, '__qualname__', read)} hung (> {HANG_SECONDS} s)"
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


@pytest.fixture(scope="session")
def valid(tmp_path_factory) -> Files:
    """Every valid file the tests mutate, by name."""
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer

    root = tmp_path_factory.mktemp("valid")
    files = Files()

    char = CharTokenizer.train(TEXTS)
    char.save(root / "char.json")
    files["char.json"] = (root / "char.json").read_bytes()
    BPETokenizer.train(TEXTS * 20, vocab_size=300).save_hf(root / "tokenizer.json")
    files["tokenizer.json"] = (root / "tokenizer.json").read_bytes()
    files["vocab.txt"] = ("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",
                                     "quick", "brown", "##s", "fox", ",", "."]) + "\n").encode()
    files["tokenizer_config.json"] = json.dumps({"do_lower_case": False,
                                                 "model_max_length": 512}).encode()
    wordpiece = WordPieceTokenizer.from_vocab(files["vocab.txt"].decode().splitlines())
    wordpiece.backend.save(str(root / "wordpiece.json"))
    files["wordpiece/tokenizer.json"] = (root / "wordpiece.json").read_bytes()

    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt-mini", **TINY_GPT)
    model = build_model(config)
    save_model_dir(root / "model", model, model.config, {"text": char.to_dict()})
    for name in ("model.safetensors", "config.json", "tokenizers.json"):
        files[f"model/{name}"] = (root / "model" / name).read_bytes()
    save_pretrained(model, root / "hf")
    for name in ("model.safetensors", "config.json"):
        files[f"hf/{name}"] = (root / "hf" / name).read_bytes()
    shard = "model-00001-of-00001.safetensors"  # the same weights as a sharded folder's
    names = load_file(root / "hf" / "model.safetensors")
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {name: shard for name in names}}).encode()
    # Llama-style (RoPE) models, for the known cases below
    llama = build_model(ModelConfig.from_preset("llama-mini", **TINY_GPT, num_kv_heads=2))
    save_model_dir(root / "llama", llama, llama.config, {"text": char.to_dict()})
    for name in ("model.safetensors", "config.json", "tokenizers.json"):
        files[f"llama/{name}"] = (root / "llama" / name).read_bytes()
    save_pretrained(llama, root / "hf-llama")
    for name in ("model.safetensors", "config.json"):
        files[f"hf-llama/{name}"] = (root / "hf-llama" / name).read_bytes()
    files["config.json"] = files["model/config.json"]

    optimizer = {"state": {0: {"exp_avg": torch.randn(4, 4), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    torch.save({"step": 12, "epoch": 1, "lr": [0.1, 0.01], "rng": torch.get_rng_state()[:64],
                "optimizer": optimizer, "position": [3, 1, 4]}, root / "trainer_state.pt")
    files["trainer_state.pt"] = (root / "trainer_state.pt").read_bytes()

    rows = [{"id": str(i), "text": t, "label": "pos" if i % 2 else "neg"}
            for i, t in enumerate(TEXTS)]
    files["data.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    files["src.txt"] = "".join(t + "\n" for t in TEXTS).encode()
    files["tgt.txt"] = "".join(t.upper() + "\n" for t in TEXTS).encode()
    return files


def safetensors_header(blob: bytes) -> int:
    """Bytes of a safetensors file's header (its 8-byte length and the JSON)."""
    return 8 + int.from_bytes(blob[:8], "little")


def put(folder: Path, files: dict[str, bytes]) -> Path:
    for name, blob in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(blob)
    return folder


# --- 1. config.json ----------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_model_config_from_json(valid, data):
    blob = data.draw(json_inputs(valid["config.json"]))
    with scratch() as d:
        holds(ModelConfig.from_json, put(d, {"config.json": blob}) / "config.json")


# --- 2. tokenizer JSON (attnlab's and Hugging Face's) ------------------------------------------
@FUZZ
@given(data=st.data())
def test_tokenizers_load(valid, data):
    from attnlab.tokenizers import load

    blob = data.draw(json_inputs(valid["char.json"]))
    with scratch() as d:
        holds(load, put(d, {"tok.json": blob}) / "tok.json")


@FUZZ
@given(data=st.data())
def test_bpe_from_hf_file(valid, data):
    from attnlab.tokenizers import BPETokenizer

    blob = data.draw(json_inputs(valid["tokenizer.json"]))
    with scratch() as d:
        holds(BPETokenizer.from_file, put(d, {"tokenizer.json": blob}) / "tokenizer.json")


# --- 3. WordPiece: vocab.txt and tokenizer_config.json -----------------------------------------
@FUZZ
@given(data=st.data())
def test_wordpiece_vocab_txt(valid, data):
    from attnlab.tokenizers import WordPieceTokenizer

    blob = data.draw(damaged(valid["vocab.txt"]))
    with scratch() as d:
        holds(WordPieceTokenizer.from_file, put(d, {"vocab.txt": blob}) / "vocab.txt")


@FUZZ
@given(data=st.data())
def test_wordpiece_folder_tokenizer_config(valid, data):
    from attnlab.tokenizers import WordPieceTokenizer

    blob = data.draw(json_inputs(valid["tokenizer_config.json"]))
    with scratch() as d:
        holds(WordPieceTokenizer.from_file,
              put(d, {"vocab.txt": valid["vocab.txt"], "tokenizer_config.json": blob}))


@FUZZ
@given(data=st.data())
def test_wordpiece_tokenizer_json(valid, data):
    from attnlab.tokenizers import WordPieceTokenizer

    blob = data.draw(json_inputs(valid["wordpiece/tokenizer.json"]))
    with scratch() as d:
        holds(WordPieceTokenizer.from_file, put(d, {"tokenizer.json": blob}))


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


@pytest.fixture(scope="session")
def valid_gguf(tmp_path_factory) -> Files:
    """The tiny GGUF file's bytes, and where its tensor data starts (``data_offset``)."""
    pytest.importorskip("gguf")
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    files = Files({"tiny.gguf": path.read_bytes()})
    files.data_offset = gguf.GGUFReader(str(path)).data_offset
    return files


def test_the_tiny_gguf_file_loads(valid_gguf):
    from attnlab.interop.gguf import load_gguf

    with scratch() as d:
        model, tok = load_gguf(put(d, {"tiny.gguf": valid_gguf["tiny.gguf"]}) / "tiny.gguf")
    ids = torch.tensor([tok.encode("hello ab")])
    assert ids.shape[1] == 3  # hello, Ġa, b
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (1, 3, len(GGUF_TOKENS)) and torch.isfinite(logits).all()


@FUZZ
@given(data=st.data())
def test_load_gguf(valid_gguf, data):
    from attnlab.interop.gguf import load_gguf

    blob = data.draw(damaged(valid_gguf["tiny.gguf"], hot=valid_gguf.data_offset, keep=4))
    with scratch() as d:
        holds(load_gguf, put(d, {"m.gguf": blob}) / "m.gguf")


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


@FUZZ
@given(edits=gguf_edits())
def test_load_gguf_with_drawn_metadata_and_tensors(valid_gguf, edits):
    from attnlab.interop.gguf import load_gguf

    with scratch() as d:
        write_tiny_gguf(d / "m.gguf", *edits)
        holds(load_gguf, d / "m.gguf")


# --- 5. attnlab model folders ------------------------------------------------------------------
def _load_model_folder(valid, name: str, blob: bytes):
    from attnlab.storage import load

    files = {n.removeprefix("model/"): b for n, b in valid.items() if n.startswith("model/")}
    with scratch() as d:
        holds(load, put(d / "model", {**files, name: blob}))


@FUZZ
@given(data=st.data())
def test_storage_load_damaged_safetensors(valid, data):
    blob = valid["model/model.safetensors"]
    _load_model_folder(valid, "model.safetensors",
                       data.draw(damaged(blob, hot=safetensors_header(blob))))


@FUZZ
@given(data=st.data())
def test_storage_load_damaged_config(valid, data):
    _load_model_folder(valid, "config.json", data.draw(json_inputs(valid["model/config.json"])))


@FUZZ
@given(data=st.data())
def test_storage_load_damaged_tokenizers(valid, data):
    _load_model_folder(valid, "tokenizers.json",
                       data.draw(json_inputs(valid["model/tokenizers.json"])))


# --- 6. trainer state --------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_load_trainer_state(valid, data):
    from attnlab.training.checkpoint import load_trainer_state

    blob = data.draw(damaged(valid["trainer_state.pt"]))
    with scratch() as d:
        holds(load_trainer_state, put(d, {"trainer_state.pt": blob}))


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


@FUZZ
@given(data=st.data())
def test_read_labelled(valid, data):
    from attnlab.data.classify import read_labelled

    blob = data.draw(jsonl_inputs(valid["data.jsonl"]))
    with scratch() as d:
        holds(read_labelled, put(d, {"data.jsonl": blob}) / "data.jsonl", "text", "label")


@FUZZ
@given(data=st.data())
def test_read_labelled_gz(valid, data):
    from attnlab.data.classify import read_labelled

    blob = data.draw(gzipped(jsonl_inputs(valid["data.jsonl"])))
    with scratch() as d:
        holds(read_labelled, put(d, {"data.jsonl.gz": blob}) / "data.jsonl.gz", "text", "label")


# --- 8. text and parallel text -----------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_read_parallel(valid, data):
    from attnlab.data import read_parallel

    src = data.draw(st.just(valid["src.txt"]) | damaged(valid["src.txt"]))
    tgt = data.draw(damaged(valid["tgt.txt"]))
    if data.draw(st.booleans()):
        src, tgt = tgt, src
    with scratch() as d:
        put(d, {"src.txt": src, "tgt.txt": tgt})
        holds(read_parallel, d / "src.txt", d / "tgt.txt")


@FUZZ
@given(data=st.data())
def test_read_lines(valid, data):
    from attnlab.data import read_lines

    blob = data.draw(damaged(valid["src.txt"]))
    with scratch() as d:
        holds(read_lines, put(d, {"src.txt": blob}) / "src.txt")


@FUZZ
@given(data=st.data())
def test_read_lines_gz(valid, data):
    from attnlab.data import read_lines

    blob = data.draw(gzipped(damaged(valid["src.txt"])))
    with scratch() as d:
        holds(read_lines, put(d, {"src.txt.gz": blob}) / "src.txt.gz")


@FUZZ
@given(data=st.data())
def test_read_text(valid, data):
    from attnlab.data import read_text

    blob = data.draw(damaged(valid["src.txt"]))
    with scratch() as d:
        holds(read_text, put(d, {"src.txt": blob}) / "src.txt")


# --- 9. Hugging Face folders -------------------------------------------------------------------
def _from_pretrained(valid, name: str, blob: bytes):
    from attnlab.interop import from_pretrained

    files = {n.removeprefix("hf/"): b for n, b in valid.items() if n.startswith("hf/")}
    with scratch() as d:
        holds(from_pretrained, put(d / "hf", {**files, name: blob}))


@FUZZ
@given(data=st.data())
def test_from_pretrained_damaged_config(valid, data):
    _from_pretrained(valid, "config.json", data.draw(json_inputs(valid["hf/config.json"])))


@FUZZ
@given(data=st.data())
def test_from_pretrained_damaged_shard_index(valid, data):
    """A sharded folder: ``model.safetensors.index.json`` names the weight files."""
    from attnlab.interop import from_pretrained

    files = {"config.json": valid["hf/config.json"],
             "model-00001-of-00001.safetensors": valid["hf/model.safetensors"],
             "model.safetensors.index.json":
                 data.draw(json_inputs(valid["model.safetensors.index.json"]))}
    with scratch() as d:
        holds(from_pretrained, put(d / "hf", files))


@FUZZ
@given(data=st.data())
def test_storage_load_hf_folder_damaged_tokenizer(valid, data):
    """``attnlab.load`` on a Hugging Face folder also reads its ``tokenizer.json``."""
    from attnlab.storage import load

    files = {n.removeprefix("hf/"): b for n, b in valid.items() if n.startswith("hf/")}
    files["tokenizer.json"] = data.draw(json_inputs(valid["tokenizer.json"]))
    with scratch() as d:
        holds(load, put(d / "hf", files))


@FUZZ
@given(data=st.data())
def test_from_pretrained_damaged_safetensors(valid, data):
    blob = valid["hf/model.safetensors"]
    _from_pretrained(valid, "model.safetensors",
                     data.draw(damaged(blob, hot=safetensors_header(blob))))


# --- known cases -------------------------------------------------------------------------------
# Damage that the examples above reach only now and then, each once escaped as another
# exception or allocated gigabytes: sizes torch cannot describe (RuntimeError "Storage size
# calculation overflowed", TypeError "Overflow when unpacking long long"), and a context length
# whose computed RoPE or sinusoidal tables the weights do not back (2**22 positions: 2 GB).
@pytest.mark.parametrize("folder, fields", [
    ("model", {"d_model": 2**31}), ("model", {"vocab_size": 2**64}),
    ("llama", {"max_len": 2**22}), ("llama", {"max_len": 10**30}),
    ("hf", {"n_embd": 2**63}), ("hf", {"n_inner": 10**30}),
    ("hf-llama", {"max_position_embeddings": 2**22}),
])
def test_known_damaged_configs_are_refused(valid, folder, fields):
    from attnlab.interop import from_pretrained
    from attnlab.storage import load

    files = {n.split("/", 1)[1]: b for n, b in valid.items() if n.startswith(folder + "/")}
    files["config.json"] = json.dumps({**json.loads(files["config.json"]), **fields}).encode()
    with scratch() as d:
        read = from_pretrained if folder.startswith("hf") else load
        assert isinstance(holds(read, put(d / folder, files)), AttnlabError)


@pytest.mark.parametrize("key, entry", [
    ("llama.context_length", (2**31, "UINT32")), ("llama.context_length", (2**24, "UINT32")),
    ("llama.embedding_length", (2**31, "UINT32")),
    ("llama.embedding_length", (2**63, "UINT64")),
    ("llama.feed_forward_length", (float("inf"), "FLOAT32")),
    ("tokenizer.ggml.merges", None), ("tokenizer.ggml.merges", ([1, 2], "ARRAY", "UINT32")),
])
def test_known_damaged_gguf_metadata_is_refused(valid_gguf, key, entry):
    from gguf import GGUFValueType  # (valid_gguf: skipped without the gguf package)

    from attnlab.interop.gguf import load_gguf

    if entry is not None:
        entry = (entry[0], *(GGUFValueType[t] for t in entry[1:]))
    with scratch() as d:
        write_tiny_gguf(d / "m.gguf", {key: entry})
        assert isinstance(holds(load_gguf, d / "m.gguf"), AttnlabError)
