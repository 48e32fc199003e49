"""Training a shared byte-level BPE vocabulary, and the tokenize commands."""

import transformers

from attnlab.cli import main
from attnlab.tokenizers import BPETokenizer

DE = ["Zwei junge Männer sind im Freien in der Nähe vieler Büsche.",
      "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."] * 30
EN = ["Two young men are outside near many bushes.",
      "A little girl climbing into a wooden playhouse."] * 30


def test_trained_vocabulary_ids_specials_and_round_trip(tmp_path):
    tok = BPETokenizer.train(DE + EN, vocab_size=400)
    assert 300 < tok.vocab_size <= 400
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert [tok.backend.id_to_token(i) for i in range(4)] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    unseen = "Überraschung! Ein Käfer fährt 3 km nach Zürich 🙂"
    assert tok.decode(tok.encode(unseen)) == unseen  # byte-level: nothing is unknown
    ids = tok.encode("Zwei junge Männer", add_bos=True, add_eos=True)
    assert ids[0] == 2 and ids[-1] == 3 and tok.decode(ids) == "Zwei junge Männer"
    # the saved tokenizer.json is what transformers reads, with the same ids
    tok.save_hf(tmp_path / "tokenizer.json")
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path /
                                                                      "tokenizer.json"))
    for text in DE[:2] + EN[:2] + [unseen]:
        assert reference(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    back = BPETokenizer.from_file(tmp_path / "tokenizer.json")
    assert back.encode(unseen) == tok.encode(unseen) and back.eos_id == 3


def test_tokenize_commands(tmp_path, capsys):
    (tmp_path / "a.de").write_text("\n".join(DE) + "\n")
    (tmp_path / "a.en").write_text("\n".join(EN) + "\n")
    out = tmp_path / "tokenizer.json"
    assert main(["tokenize", "train", "--vocab-size", "300", str(tmp_path / "a.de"),
                 str(tmp_path / "a.en"), "--out", str(out)]) == 0
    assert "byte-level BPE" in capsys.readouterr().out
    assert main(["tokenize", "encode", "--tokenizer", str(out), "--pieces",
                 "Two young men"]) == 0
    ids_line, pieces_line = capsys.readouterr().out.splitlines()
    tok = BPETokenizer.from_file(out)
    assert [int(x) for x in ids_line.split()] == tok.encode("Two young men")
    assert "".join(pieces_line.split()).replace("Ġ", " ") == "Two young men"


def test_corrupt_tokenizer_file_is_named(tmp_path, capsys):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": \n {"bad')
    assert main(["tokenize", "encode", "--tokenizer", str(bad), "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"attnlab tokenize: error: {bad}:2: invalid tokenizer JSON")
    assert len(err.splitlines()) == 1
