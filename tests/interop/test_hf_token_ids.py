"""Special token ids in a Hugging Face config.json: out of range (past the vocabulary, 2^63,
negative) is one line naming the field and exit code 2, never a traceback (transformers warns
of the same ids); a negative pad_token_id means none (early Llama conversions write -1); a
list of eos ids (Llama 3) loads with its first as the model's eos."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import attnlab
from attnlab.errors import BadInput
from attnlab.tokenizers import BPETokenizer
from tests.cli.helpers import assert_bad_input, cli

TEXT = "the quick brown fox jumps over the lazy dog, and the dog sleeps on. " * 3


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random transformers Llama over a BPE vocabulary, with its tokenizer.json."""
    folder = tmp_path_factory.mktemp("llama")
    tok = BPETokenizer.train([TEXT], vocab_size=120)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64,
        bos_token_id=2, eos_token_id=3, pad_token_id=0, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_hf(folder / "tokenizer.json")
    return folder, tok.vocab_size


def with_fields(llama, tmp_path, **fields):
    folder, _ = llama
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    hf = {**json.loads((folder / "config.json").read_text()), **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


def generate(capsys, folder):
    return cli(capsys, "generate", "--model", folder, "--prompt", "the quick",
               "--max-new-tokens", "3", "--device", "cpu", "--no-compile")


BAD = [("eos_token_id", 2**63), ("bos_token_id", -1), ("bos_token_id", 2**70),
       ("pad_token_id", 2**64), ("unk_token_id", -7), ("eos_token_id", [3, 2**63]),
       ("eos_token_id", [3, -2]), ("eos_token_id", []), ("decoder_start_token_id", -5),
       ("eos_token_id", 3.0), ("bos_token_id", True)]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_an_out_of_range_token_id_is_one_line_and_exit_2(capsys, llama, tmp_path, field,
                                                         value):
    folder = with_fields(llama, tmp_path, **{field: value})
    line = assert_bad_input(generate(capsys, folder), str(folder / "config.json"), field)
    assert "internal error" not in line
    with pytest.raises(BadInput, match=field):
        attnlab.load(folder)


@pytest.mark.parametrize("field", ["eos_token_id", "bos_token_id", "pad_token_id",
                                   "decoder_start_token_id"])
def test_an_id_past_the_vocabulary_is_one_line_and_exit_2(capsys, llama, tmp_path, field):
    """GPT2Config writes 50256 over any vocab_size: the model could never emit such an eos,
    and a bos or pad past the table would be read out of range."""
    _, vocab = llama
    folder = with_fields(llama, tmp_path, **{field: vocab})
    line = assert_bad_input(generate(capsys, folder), field, f"0..{vocab - 1}")
    assert "internal error" not in line
    folder = with_fields(llama, tmp_path, **{field: vocab - 1, "eos_token_id": [3, vocab]})
    assert_bad_input(generate(capsys, folder), "eos_token_id")


def test_a_negative_pad_token_id_means_none(capsys, llama, tmp_path):
    folder = with_fields(llama, tmp_path, pad_token_id=-1)
    assert attnlab.load(folder).config.pad_id == 0  # as a config.json without one
    r = generate(capsys, folder)
    assert r.code == 0 and r.out.startswith("the quick"), r.err


def test_a_list_of_eos_ids_loads_with_the_first_as_eos(capsys, llama, tmp_path):
    folder = with_fields(llama, tmp_path, eos_token_id=[3, 5, 7])
    assert attnlab.load(folder).config.eos_id == 3
    r = generate(capsys, folder)
    assert r.code == 0 and r.out.startswith("the quick"), r.err


@pytest.mark.parametrize("value", [2**63, -1])
def test_an_id_no_int64_holds_in_attnlabs_own_config_is_refused(value):
    with pytest.raises(BadInput, match=rf"config field eos_id={value} is not a token id"):
        attnlab.ModelConfig.from_preset("llama-mini", eos_id=value)
