import gzip

import pytest

from attnlab.data import (
    TranslationBatches,
    english,
    filter_by_length,
    german,
    make_batches,
    numbers_corpus,
    read_parallel,
)


@pytest.mark.parametrize("n, en, de", [
    (0, "zero", "null"), (1, "one", "eins"), (16, "sixteen", "sechzehn"),
    (21, "twenty-one", "einundzwanzig"), (42, "forty-two", "zweiundvierzig"),
    (101, "one hundred one", "einhunderteins"), (1001, "one thousand one", "eintausendeins"),
    (30517, "thirty thousand five hundred seventeen", "dreißigtausendfünfhundertsiebzehn"),
    (999999, "nine hundred ninety-nine thousand nine hundred ninety-nine",
     "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
])
def test_number_words(n, en, de):
    assert english(n) == en and german(n) == de


def test_held_out_numbers_never_in_training():
    train, test = numbers_corpus(5000, 200, seed=3)
    assert len(test) == 200 and not set(train) & set(test)
    assert numbers_corpus(5000, 200, seed=3) == (train, test)


def test_read_parallel_plain_and_gz(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with gzip.open(tmp_path / "a.de.gz", "wt") as f:
        f.write("eins\nzwei\n")
    assert read_parallel(tmp_path / "a.en", tmp_path / "a.de.gz") == [
        ("one", "eins"), ("two", "zwei")]


def test_read_parallel_errors(tmp_path):
    (tmp_path / "s").write_text("a\nb\nc\n")
    (tmp_path / "t").write_text("x\ny\n")
    (tmp_path / "e1").write_text("")
    (tmp_path / "e2").write_text("")
    with pytest.raises(ValueError, match="has 3 lines but .* has 2"):
        read_parallel(tmp_path / "s", tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="nothere"):
        read_parallel(tmp_path / "nothere", tmp_path / "t")
    with pytest.raises(ValueError, match="empty corpus"):
        read_parallel(tmp_path / "e1", tmp_path / "e2")


def test_length_filter_reports_what_it_dropped():
    src, tgt, report = filter_by_length([[1, 2], [], [1] * 9, [4]], [[3], [3], [3], [5] * 9], 8)
    assert src == [[1, 2]] and tgt == [[3]]
    assert (report.kept, report.dropped_empty, report.dropped_long) == (1, 1, 2)
    assert "dropped 1 with an empty side and 2 longer than 8" in str(report)


def test_batches_respect_max_tokens_and_cover_everything():
    lengths = [3, 10, 7, 7, 2, 15, 4, 4, 4, 9]
    batches = make_batches(lengths, max_tokens=20, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert all(len(b) * max(lengths[i] for i in b) <= 20 for b in batches)
    assert make_batches(lengths, 20, seed=1) == batches


def test_iterator_position_restores_exactly():
    src = [[5] * (i % 7 + 1) for i in range(50)]
    stream = TranslationBatches(src, src, max_tokens=16, seed=4)
    it = iter(stream)
    for _ in range(13):  # past an epoch boundary
        next(it)
    state = stream.state_dict()
    expected = [next(it) for _ in range(5)]
    resumed = TranslationBatches(src, src, max_tokens=16, seed=4)
    resumed.load_state_dict(state)
    it2 = iter(resumed)
    for (a, b), (c, d) in zip(expected, [next(it2) for _ in range(5)], strict=True):
        assert a.equal(c) and b.equal(d)


def test_shards_split_each_global_batch():
    src = [[5] * 3 for _ in range(8)]
    whole = next(iter(TranslationBatches(src, src, 12, seed=0)))[0]
    parts = [next(iter(TranslationBatches(src, src, 12, seed=0).shard(r, 2)))[0] for r in (0, 1)]
    assert whole.shape[0] == 4 and parts[0].shape[0] == parts[1].shape[0] == 2
