"""``attnlab tokenize train`` and ``tokenize encode``.

Covered elsewhere, not repeated here:

- tokenize train: happy path tests/tokenizers/test_bpe_train.py::test_tokenize_commands,
  tests/training/test_evaluate.py::test_shared_bpe_training_and_evaluate.
- tokenize encode: happy path tests/tokenizers/test_bpe_train.py::test_tokenize_commands (the
  ids equal BPETokenizer's, the pieces join back to the text); bad input
  ::test_corrupt_tokenizer_file_is_named.

Here: bad input of ``tokenize train``, and ``encode`` of a vocabulary learned here decoding
back to its text.
"""

from attnlab.tokenizers import BPETokenizer
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
