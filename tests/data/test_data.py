import gzip
from itertools import islice

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


def _rows(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A padded translation batch's (source, target) rows, the padding (id 0) stripped."""
    return [(tuple(t for t in s.tolist() if t), tuple(t for t in g.tolist() if t))
            for s, g in zip(batch.src, batch.tgt, strict=True)]


def test_shards_split_each_global_batch():
    """Data-parallel ranks train on the global batch between them: rank r of 2 gets rows of
    each global batch that the other rank does not (a rank given the other's rows, or every
    rank the same shard, trains on half the data twice), the two halves are the batch, each
    row keeps its own target, and over an epoch every example is seen once. Every row is
    distinct (its own tokens, three lengths), so a wrong row cannot pass for a right one."""
    n = 20
    src = [[i + 1] * (i % 3 + 1) for i in range(n)]
    tgt = [[100 + i, i + 1] for i in range(n)]  # tied to its source row
    examples = sorted(zip(map(tuple, src), map(tuple, tgt), strict=True))

    def stream():
        return TranslationBatches(src, tgt, max_tokens=12, seed=0)

    per_epoch = len(stream().batches)
    assert per_epoch > 1 and all(len(b) % 2 == 0 for b in stream().batches)  # even halves
    whole = [_rows(b) for b in islice(stream(), per_epoch)]
    ranks = [[_rows(b) for b in islice(stream().shard(r, 2), per_epoch)] for r in (0, 1)]
    for batch, mine, theirs in zip(whole, *ranks, strict=True):
        assert len(mine) == len(theirs) == len(batch) // 2
        assert not set(mine) & set(theirs)
        assert sorted(mine + theirs) == sorted(batch)
    assert sorted(row for part in ranks for rows in part for row in rows) == examples
