"""attnlab.files: every failure of a user's text or JSON file is one error naming the file."""

import gzip

import pytest

from attnlab.errors import BadInput, MissingFile
from attnlab.files import parse_json, read_json, read_lines, read_text


def test_read_text_names_what_is_wrong(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("eins\nzwei\n", encoding="utf-8")
    assert read_text(good) == "eins\nzwei\n"
    with pytest.raises(MissingFile, match=r"missing.txt: no such text file"):
        read_text(tmp_path / "missing.txt", "text file")
    with pytest.raises(BadInput, match="a directory, not a file"):
        read_text(tmp_path)
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"ok\nstill ok\ncaf\xe9\n")
    with pytest.raises(BadInput, match=r"b.txt:3: not UTF-8 text \(byte 15: invalid "
                                       r"continuation byte\)"):
        read_text(binary)


def test_read_text_refuses_an_empty_file_only_when_asked(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n", encoding="utf-8")
    assert read_text(blank) == " \n\n"
    with pytest.raises(BadInput, match="blank.txt: the text file is empty"):
        read_text(blank, "text file", allow_empty=False)


def test_read_lines_plain_and_gzip(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("one\ntwo\n")
    assert read_lines(tmp_path / "a.txt") == read_lines(tmp_path / "a.txt.gz") == ["one", "two"]
    (tmp_path / "bad.txt").write_bytes(b"one\n\xff\n")
    with pytest.raises(BadInput, match=r"bad.txt:2: not UTF-8 text"):
        read_lines(tmp_path / "bad.txt")
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(b"one\ntwo\n")[:-6])
    with pytest.raises(BadInput, match=r"bad.txt.gz:\d+: cannot be read"):
        read_lines(tmp_path / "bad.txt.gz")
    with pytest.raises(MissingFile, match="nothing.txt: no such file"):
        read_lines(tmp_path / "nothing.txt")


def test_json_documents(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"a": 1}', encoding="utf-8")
    assert read_json(path) == {"a": 1}
    with pytest.raises(MissingFile, match="no such config file"):
        read_json(tmp_path / "none.json", missing="config file")
    with pytest.raises(BadInput, match=r"c.json:2: invalid JSON"):
        parse_json('{"a":\n', path)
    with pytest.raises(BadInput, match=r"rows.jsonl:7: expected a JSON object, got list"):
        parse_json("[1, 2]", "rows.jsonl", line=7)
    assert parse_json("[1, 2]", path, require_object=False) == [1, 2]
    with pytest.raises(BadInput, match="unreadable JSON"):
        parse_json("[" * 100_000 + "]" * 100_000, path)
    with pytest.raises(BadInput, match="unreadable JSON"):
        parse_json('{"a": ' + "9" * 5000 + "}", path)
