"""GPT-2's byte-level BPE from encoder.json + vocab.bpe, against transformers' GPT2Tokenizer
built from the same files (needs ../shared/data/gpt2-bpe)."""

from pathlib import Path

import pytest

from attnlab.tokenizers.bpe import BPETokenizer

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
BPE_DIR = DATA / "gpt2-bpe"
pytestmark = pytest.mark.skipif(not (BPE_DIR / "encoder.json").exists(),
                                reason=f"GPT-2 BPE files not found in {BPE_DIR}")


@pytest.fixture(scope="module")
def tokenizers():
    import transformers

    ours = BPETokenizer.from_gpt2_files(BPE_DIR / "encoder.json", BPE_DIR / "vocab.bpe")
    theirs = transformers.GPT2Tokenizer(str(BPE_DIR / "encoder.json"), str(BPE_DIR / "vocab.bpe"))
    return ours, theirs


def test_hello_world(tokenizers):
    ours, _ = tokenizers
    assert ours.encode("Hello world") == [15496, 995]
    assert ours.vocab_size == 50257 and ours.eos_id == 50256


def test_long_text_matches_transformers(tokenizers):
    ours, theirs = tokenizers
    shakespeare = DATA / "tinyshakespeare" / "input.txt"
    text = shakespeare.read_text()[:20000] if shakespeare.exists() else ""
    text += " Ünïcödé, emoji 🙂, numbers 3.14159 and 1,000,000, code `x = y**2`\n\n  spaces."
    ids = ours.encode(text)
    assert ids == theirs.encode(text)
    assert ours.decode(ids) == text


def test_save_and_load_round_trip(tokenizers, tmp_path):
    from attnlab.tokenizers import load

    ours, _ = tokenizers
    ours.save(tmp_path / "tok.json")
    again = load(tmp_path / "tok.json")
    assert again.encode("Hello world") == [15496, 995] and again.eos_id == 50256
