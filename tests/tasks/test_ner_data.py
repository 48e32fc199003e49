"""CoNLL reading and BIO entity spans, against hand-worked cases and the real CoNLL-2003 counts."""

from pathlib import Path

import pytest

from attnlab.errors import BadInput
from attnlab.tasks.ner import Sentence, entities, read_conll

CONLL = Path(__file__).resolve().parents[3] / "shared" / "data" / "conll2003"

SAMPLE = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_reads_words_and_last_column_tags(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(SAMPLE)
    assert read_conll(path) == [
        Sentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
        Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
    ]


@pytest.mark.parametrize("tags, spans", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
    (["B-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)]),       # B always begins
    (["O", "I-ORG", "I-ORG"], [("ORG", 1, 3)]),                 # a stray I begins one
    (["B-PER", "I-LOC", "I-LOC", "O"], [("PER", 0, 1), ("LOC", 1, 3)]),  # type change
    (["O", "O"], []),
    (["I-MISC"], [("MISC", 0, 1)]),
])
def test_entity_spans_worked_by_hand(tags, spans):
    assert entities(tags) == spans


@pytest.mark.parametrize("text, message", [
    ("EU NNP B-ORG\nrejects O\n", "a.txt:2: expected 3 columns (as on the first line), got 2"),
    ("EU NNP E-ORG\n", "a.txt:1: tag 'E-ORG' is not in the BIO scheme"),
    ("EU\n", "a.txt:1: expected a word and a tag"),
    ("\n-DOCSTART- -X- O\n\n", "a.txt: no sentences"),
])
def test_bad_files_are_one_error_naming_the_line(tmp_path, text, message):
    path = tmp_path / "a.txt"
    path.write_text(text)
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_conll(path)


@pytest.mark.skipif(not CONLL.exists(), reason="../shared/data/conll2003 is not here")
def test_conll2003_test_set_has_its_published_size():
    sentences = read_conll(CONLL / "test.txt")
    # the README's 3,684 "sentences" count the 231 -DOCSTART- lines too; its 46,435 tokens do not
    assert len(sentences) == 3684 - 231
    assert sum(len(s.words) for s in sentences) == 46435
    counts = {}
    for s in sentences:
        for kind, _, _ in entities(s.tags):
            counts[kind] = counts.get(kind, 0) + 1
    # the B- tag counts of the file: every entity begins with B- in CoNLL-2003's IOB2 form
    assert counts == {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617}


def test_the_tag_set_has_both_tags_of_every_type_in_a_fixed_order():
    from attnlab.tasks.ner import tag_set

    sentences = [Sentence(("a", "b"), ("B-PER", "O")), Sentence(("c",), ("I-LOC",))]
    assert tag_set(sentences) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert tag_set(sentences[::-1]) == tag_set(sentences)
