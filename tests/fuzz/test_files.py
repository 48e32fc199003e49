"""Property-based fuzzing of every reader of user files in attnlab.

The property: given mutated or random bytes where a user file belongs, each reader either
returns normally or raises an :class:`attnlab.errors.AttnlabError` (the command line turns it
into one line naming the file) -- never another exception type, never a hang, never large
memory. Concretely, for each reader:

* no exception other than an ``AttnlabError`` escapes (the tests catch nothing else);
* no example runs longer than ``HANG_SECONDS`` (20 s, a ``SIGALRM`` that fails the test even
  if the reader swallows the ``AssertionError`` it raises; it interrupts Python code, so a loop
  inside a C or Rust extension would only be caught when it returns);
* no example (one read) raises the peak resident memory more than ``MEMORY_BOUND`` = 1 GB
  above what the process held before it: the peak (``VmHWM``) is reset before each read, so
  the bound holds in ``make test`` too, after tests that reached gigabytes, and sees a buffer
  freed before the reader returned (``bounded_memory``; off Linux, the weaker ``ru_maxrss``).

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
7. ``attnlab.tasks.classify.read_labelled`` on JSON lines, plain and ``.gz``;
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
``test_known_*`` tests of test_models.py, each of which once escaped or allocated gigabytes.

``ATTNLAB_FUZZ_EXAMPLES=N`` sets the examples per test (default 25) and, when set, draws new
random examples on each run; by default the examples are the same on every run.
"""

from __future__ import annotations

import mmap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab import ModelConfig
from tests.fuzz.fuzzing import (
    FUZZ,
    bounded_memory,
    damaged,
    gzipped,
    holds,
    json_inputs,
    jsonl_inputs,
    put,
    scratch,
)


def test_the_memory_bound_sees_a_freed_buffer_after_a_higher_earlier_peak():
    """The bound must bite in ``make test`` too, where earlier tests have left the process's
    peak gigabytes high, and for a buffer the reader frees before it returns (then gone from
    the current RSS). A bound on the process-wide peak (``ru_maxrss``) fails here."""
    mib = 2**20
    _touch(96 * mib)  # an earlier, higher peak, freed
    with pytest.raises(AssertionError, match="a 64 MiB buffer: peak memory grew by"):
        with bounded_memory("a 64 MiB buffer", bound=32 * mib):
            _touch(64 * mib)
    with bounded_memory("a 4 MiB buffer", bound=32 * mib):
        _touch(4 * mib)


def _touch(size: int) -> None:
    """Hold ``size`` bytes of fresh pages, every page written, then give them back. An
    anonymous map gets new pages from the kernel; a malloc'd buffer may reuse memory the
    process still holds from earlier tests, which adds nothing to its resident size."""
    with mmap.mmap(-1, size) as pages:
        for at in range(0, size, mmap.PAGESIZE):
            pages[at] = 1


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


# --- 6. trainer state --------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_load_trainer_state(valid, data):
    from attnlab.training.checkpoint import load_trainer_state

    blob = data.draw(damaged(valid["trainer_state.pt"]))
    with scratch() as d:
        holds(load_trainer_state, put(d, {"trainer_state.pt": blob}))


@FUZZ
@given(data=st.data())
def test_read_labelled(valid, data):
    from attnlab.tasks.classify import read_labelled

    blob = data.draw(jsonl_inputs(valid["data.jsonl"]))
    with scratch() as d:
        holds(read_labelled, put(d, {"data.jsonl": blob}) / "data.jsonl", "text", "label")


@FUZZ
@given(data=st.data())
def test_read_labelled_gz(valid, data):
    from attnlab.tasks.classify import read_labelled

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
    from attnlab.files import read_lines

    blob = data.draw(damaged(valid["src.txt"]))
    with scratch() as d:
        holds(read_lines, put(d, {"src.txt": blob}) / "src.txt")


@FUZZ
@given(data=st.data())
def test_read_lines_gz(valid, data):
    from attnlab.files import read_lines

    blob = data.draw(gzipped(damaged(valid["src.txt"])))
    with scratch() as d:
        holds(read_lines, put(d, {"src.txt.gz": blob}) / "src.txt.gz")


@FUZZ
@given(data=st.data())
def test_read_text(valid, data):
    from attnlab.files import read_text

    blob = data.draw(damaged(valid["src.txt"]))
    with scratch() as d:
        holds(read_text, put(d, {"src.txt": blob}) / "src.txt", "text file", False)
