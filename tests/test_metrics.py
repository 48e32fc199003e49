"""ROUGE against the course's formulas worked by hand, and against rouge-score; the
``evaluate text`` command; the deprecated flat ``evaluate``.

Worked by hand (words, no stemming):

1. reference "the cat sat on the mat", hypothesis "the cat lay on the mat today"
   unigrams: overlap the×2, cat, on, mat = 5 of 7 (P) and of 6 (R): F = 2·(5/7)(5/6)/(5/7+5/6)
   = 10/13; bigrams: the-cat, on-the, the-mat = 3 of 6 and of 5: F = 6/11; LCS "the cat on the
   mat" = 5: P 5/7, R 5/6, F = 10/13.
2. reference "the gunman shot the police", hypothesis "police shot the gunman"
   unigrams: police, shot, the, gunman = 4 of 4 and of 5: F = 8/9; bigrams: shot-the,
   the-gunman = 2 of 3 and of 4: F = 4/7; LCS "shot the" = 2: P 2/4, R 2/5, F = 4/9.
"""

import pytest
from rouge_score.rouge_scorer import RougeScorer

from attnlab.metrics import UnicodeWords, rouge
from tests.cli.helpers import assert_bad_input, cli

REFS = ["the cat sat on the mat", "the gunman shot the police"]
HYPS = ["the cat lay on the mat today", "police shot the gunman"]
BY_HAND = {  # (precision, recall) of each example
    "rouge1": [(5 / 7, 5 / 6), (4 / 4, 4 / 5)],
    "rouge2": [(3 / 6, 3 / 5), (2 / 3, 2 / 4)],
    "rougeL": [(5 / 7, 5 / 6), (2 / 4, 2 / 5)],
}


def f_measure(p, r):
    return 2 * p * r / (p + r)


@pytest.mark.parametrize("lang", ["en", "de"])  # rouge-score's English words; Unicode words
def test_rouge_equals_the_formulas_worked_by_hand(lang):
    scores = rouge(HYPS, REFS, lang)
    assert f_measure(*BY_HAND["rouge1"][0]) == pytest.approx(10 / 13)
    for name, pairs in BY_HAND.items():
        expected_f = sum(f_measure(p, r) for p, r in pairs) / 2
        assert scores[name].fmeasure == pytest.approx(expected_f, abs=1e-12), name
        assert scores[name].precision == pytest.approx(sum(p for p, _ in pairs) / 2)
        assert scores[name].recall == pytest.approx(sum(r for _, r in pairs) / 2)


def test_rouge_equals_rouge_score_per_example_means():
    """On German text with umlauts, ß and sentence breaks: the mean of rouge-score's own
    per-example figures, its tokenizer replaced by Unicode words and stemming off."""
    refs = ["Zwei Männer gehen über die Straße.\nEin Hund läuft.", "Ein Kind spielt im Park."]
    hyps = ["Ein Hund läuft.\nZwei Männer gehen über eine Straße.", "Kinder spielen im Park."]
    scorer = RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=False,
                         tokenizer=UnicodeWords())
    ours = rouge(hyps, refs, "de")
    for name, score in ours.items():
        theirs = [scorer.score(r, h)[name] for h, r in zip(hyps, refs, strict=True)]
        assert score.fmeasure == pytest.approx(sum(t.fmeasure for t in theirs) / 2, abs=1e-12)
    assert UnicodeWords().tokenize("Über die Straße!") == ["über", "die", "straße"]
    # the English tokenizer keeps only [a-z0-9]: the same text loses its umlauts and ß
    assert rouge(hyps, refs, "en")["rouge1"].fmeasure != ours["rouge1"].fmeasure


def test_evaluate_text_prints_rouge_lsum_over_sentences(capsys, tmp_path):
    """Sentences in swapped order: ROUGE-L (one LCS over the whole text) is 3/6, ROUGE-Lsum
    (each reference sentence against every hypothesis sentence) is 1."""
    (tmp_path / "ref.txt").write_text("the cat sat\\nthe dog ran\n")
    (tmp_path / "hyp.txt").write_text("the dog ran\\nthe cat sat\n")
    r = cli(capsys, "evaluate", "text", "--hyp", tmp_path / "hyp.txt", "--ref",
            tmp_path / "ref.txt", "--lang", "de")
    assert r.code == 0, r.err
    assert "ROUGE-L = 50.00 (P 50.00, R 50.00)" in r.out
    assert "ROUGE-Lsum = 100.00 (P 100.00, R 100.00)" in r.out
    assert "ROUGE-1 = 100.00" in r.out and "chrF = " in r.out and "BLEU = " in r.out
    assert "mean over 1 examples; Unicode words (lang de), no stemming" in r.out


def test_evaluate_text_bad_input_is_one_line(capsys, tmp_path):
    (tmp_path / "a").write_text("one\ntwo\n")
    (tmp_path / "b").write_text("eins\n")
    r = cli(capsys, "evaluate", "text", "--hyp", tmp_path / "a", "--ref", tmp_path / "b")
    assert_bad_input(r, str(tmp_path / "a"), "2 lines", "has 1")
    r = cli(capsys, "evaluate", "text", "--hyp", tmp_path / "missing", "--ref", tmp_path / "b")
    assert_bad_input(r, str(tmp_path / "missing"))


def test_the_flat_evaluate_still_runs_evaluate_translate_with_a_note(capsys, tmp_path):
    (tmp_path / "a").write_text("one\ntwo\n")
    (tmp_path / "b").write_text("eins\n")
    flat = cli(capsys, "evaluate", "--model", tmp_path / "no-model", "--src", tmp_path / "a",
               "--ref", tmp_path / "b")
    lines = flat.err.strip().splitlines()
    assert flat.code == 2 and len(lines) == 2
    assert lines[0] == ("attnlab: warning: 'attnlab evaluate --...' is deprecated and goes in "
                        "the next release; use 'attnlab evaluate translate --...'")
    new = cli(capsys, "evaluate", "translate", "--model", tmp_path / "no-model", "--src",
              tmp_path / "a", "--ref", tmp_path / "b")
    assert new.code == 2 and new.err.strip().splitlines() == lines[1:]  # the same command
