"""WordPiece against transformers' BertTokenizer (the slow, pure-Python reference)."""

import pytest
import torch
import transformers

from attnlab.tokenizers import WordPieceTokenizer, load

TEXT = ("Hello, World! Transformers' embeddings aren't static: the river bank vs. the bank "
        "account. Café naïve résumé 東京 🙂 U.S.A. 3.14159 e-mail")
PAIR = ("How old are you?", "I am six years old, unbelievably.")


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    """A small vocabulary trained on the test text (no download)."""
    folder = tmp_path_factory.mktemp("wp")
    corpus = folder / "corpus.txt"
    corpus.write_text((TEXT + "\n" + " ".join(PAIR) + "\n") * 20)
    tok = WordPieceTokenizer.train([corpus], vocab_size=200)
    vocab = tok.backend.get_vocab()
    (folder / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    return folder


@pytest.fixture(scope="module")
def pair(vocab_dir):
    ref = transformers.BertTokenizer(str(vocab_dir / "vocab.txt"), do_lower_case=True)
    return WordPieceTokenizer.from_file(vocab_dir / "vocab.txt"), ref


def test_ids_equal_bert_tokenizer(pair):
    ours, ref = pair
    assert ours.encode_single(TEXT) == ref(TEXT)["input_ids"]
    assert ours.tokenize(TEXT) == ref.tokenize(TEXT)


def test_pair_framing_and_token_types(pair):
    ours, ref = pair
    ids, types = ours.encode_pair(*PAIR)
    expected = ref(*PAIR)
    assert ids == expected["input_ids"] and types == expected["token_type_ids"]
    assert ids[0] == ours.cls_id and ids.count(ours.sep_id) == 2
    first_sep = ids.index(ours.sep_id)
    assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1 :]) == {1}


def test_batch_pads_and_masks(pair):
    ours, ref = pair
    texts = ["hello world", TEXT]
    b = ours.batch(texts, max_len=16)
    expected = ref(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    assert torch.equal(b["ids"], expected["input_ids"])
    assert torch.equal(b["attention_mask"], expected["attention_mask"])
    assert b["ids"].shape[1] == 16 and b["ids"][1, -1] == ours.sep_id


def test_lowercasing_is_configurable(vocab_dir):
    upper = WordPieceTokenizer.from_vocab(
        (vocab_dir / "vocab.txt").read_text().splitlines(), lowercase=False)
    lower = WordPieceTokenizer.from_file(vocab_dir / "vocab.txt")
    assert lower.tokenize("HELLO") == lower.tokenize("hello")
    assert upper.tokenize("HELLO") != upper.tokenize("hello")


def test_save_and_load_round_trip(pair, tmp_path):
    ours, _ = pair
    ours.save(tmp_path / "tok.json")
    back = load(tmp_path / "tok.json")
    assert back.encode(TEXT) == ours.encode(TEXT) and back.mask_id == ours.mask_id


def test_special_tokens_are_whole_and_skipped_when_decoding(pair):
    ours, ref = pair
    text = "hello [MASK] world."
    ids = ours.encode_single(text)
    assert ours.mask_id in ids and ids == ref(text)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert "[CLS]" not in ours.decode(ids) and "[MASK]" not in ours.decode(ids)


def test_own_save_format_reads_back_through_from_file(pair, tmp_path):
    ours, _ = pair
    ours.save(tmp_path / "wp.json")
    assert WordPieceTokenizer.from_file(tmp_path / "wp.json").encode(TEXT) == ours.encode(TEXT)


def test_vocabulary_without_specials_is_named(tmp_path):
    (tmp_path / "vocab.txt").write_text("hello\nworld\n[UNK]\n")
    with pytest.raises(ValueError, match="lacks the special token"):
        WordPieceTokenizer.from_file(tmp_path / "vocab.txt")
