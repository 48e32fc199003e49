"""The fuzz tests of the model readers (GGUF, attnlab model folders, Hugging Face folders);
see test_files.py for the property and the inputs."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab.errors import AttnlabError
from tests.fuzz.fuzzing import (
    FUZZ,
    GGUF_TOKENS,
    damaged,
    gguf_edits,
    holds,
    json_inputs,
    put,
    safetensors_header,
    scratch,
    write_tiny_gguf,
)


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


def test_a_huge_claimed_array_length_is_refused_before_allocating(valid_gguf):
    """A few-KB GGUF file whose token array claims 2**28 strings: refused from the bytes left,
    before anything is allocated for them. A reader that sized a list (2 GiB of slots) or a
    buffer by the claim first would still end in the same BadInput, so only ``holds``'s
    memory bound, measured around this one read, sees it."""
    from attnlab.interop.gguf import load_gguf

    blob = bytearray(valid_gguf["tiny.gguf"])
    key = b"tokenizer.ggml.tokens"
    count_at = blob.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 8  # types
    assert int.from_bytes(blob[count_at:count_at + 8], "little") == len(GGUF_TOKENS)
    blob[count_at:count_at + 8] = (2**28).to_bytes(8, "little")
    with scratch() as d:
        assert isinstance(holds(load_gguf, put(d, {"m.gguf": bytes(blob)}) / "m.gguf"),
                          AttnlabError)
