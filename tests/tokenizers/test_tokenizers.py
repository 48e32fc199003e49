import pytest

from attnlab.tokenizers import CharTokenizer, WordTokenizer, load


@pytest.mark.parametrize("cls, texts", [
    (CharTokenizer, ["zweiundvierzig", "dreißig"]),
    (WordTokenizer, ["forty-two thousand", "hello, world (again)."]),
])
def test_round_trip_specials_and_save_load(tmp_path, cls, texts):
    tok = cls.train(texts)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.vocab[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    for t in texts:
        ids = tok.encode(t, add_bos=True, add_eos=True)
        assert ids[0] == 2 and ids[-1] == 3
        assert tok.decode(ids) == t
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    tok.save(tmp_path / "tok.json")
    again = load(tmp_path / "tok.json")
    assert type(again) is cls and again.vocab == tok.vocab


def test_unknown_pieces_and_decode_stops_at_eos():
    tok = CharTokenizer.train(["abc"])
    assert tok.encode("abz") == [tok.index["a"], tok.index["b"], tok.unk_id]
    assert tok.decode([2, tok.index["a"], 3, tok.index["b"]]) == "a"


def test_word_tokenizer_splits_punctuation_and_limits_vocab():
    tok = WordTokenizer.train(["a a a b b c"], max_size=2)
    assert tok.vocab[4:] == ["a", "b"]
    assert tok.split("forty-two, yes.") == ["forty", "-", "two", ",", "yes", "."]


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{\n nope")
    with pytest.raises(ValueError, match="t.json:2"):
        load(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load(tmp_path / "missing.json")
