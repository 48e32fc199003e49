"""NER's pieces: the first-subword alignment against transformers' ``word_ids``, chunks of
whole words, predictions read at first pieces, and entity scores against seqeval."""

import random

import pytest
import torch
import transformers
from seqeval.metrics import f1_score, precision_score, recall_score

from attnlab import BERT, ModelConfig
from attnlab.data.labelled import IGNORE
from attnlab.tasks.ner import entity_scores, predict_tags, split_words, tag_text, word_pieces
from attnlab.tokenizers import WordPieceTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + ["peter", "lauter", "##bach", "visits", "new", "york", "u", ".", "s",
                    "the", "##s", "##ville", "ab", "##c", "##d", "##e"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocab")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return WordPieceTokenizer.from_file(folder / "vocab.txt"), folder / "vocab.txt"


def test_a_word_of_several_pieces_is_labelled_at_its_first(tok):
    tokenizer, vocab = tok
    words = ["Peter", "Lauterbach", "visits", "U.S.", "Abcde"]
    (chunk,) = word_pieces(tokenizer, [words], max_len=64)[0]
    pieces = [VOCAB[i] for i in chunk.ids]
    assert pieces == ["[CLS]", "peter", "lauter", "##bach", "visits", "u", ".", "s", ".",
                      "ab", "##c", "##d", "##e", "[SEP]"]
    # the same words and pieces as transformers' tokenizer gives for pre-split words
    hf = transformers.BertTokenizerFast.from_pretrained(vocab.parent)
    enc = hf(words, is_split_into_words=True)
    assert chunk.ids == enc["input_ids"]
    assert chunk.word_of == enc.word_ids()
    labels = chunk.labels([7, 8, 0, 5, 3])
    assert labels == [IGNORE, 7, 8, IGNORE, 0, 5, IGNORE, IGNORE, IGNORE, 3, IGNORE, IGNORE,
                      IGNORE, IGNORE]


def test_a_long_sentence_is_cut_into_chunks_of_whole_words(tok):
    tokenizer, _ = tok
    words = ["Lauterbach"] * 5  # two pieces each
    chunks = word_pieces(tokenizer, [words], max_len=7)[0]  # room for 5 pieces: 2 words
    assert [c.word_of for c in chunks] == [[None, 0, 0, 1, 1, None], [None, 2, 2, 3, 3, None],
                                           [None, 4, 4, None]]
    assert all(len(c.ids) <= 7 for c in chunks)


@pytest.fixture(scope="module")
def tagger(tok):
    tokenizer, _ = tok
    torch.manual_seed(0)
    config = ModelConfig.from_preset("bert-tiny", vocab_size=len(VOCAB), max_len=16,
                                     head="tokens", num_labels=5, dropout=0.0,
                                     attention_dropout=0.0,
                                     extra={"labels": ["O", "B-PER", "I-PER", "B-LOC",
                                                       "I-LOC"]})
    return BERT(config).eval(), tokenizer


def test_predicted_tags_are_the_argmax_at_first_pieces(tagger):
    model, tokenizer = tagger
    sentences = [["Peter", "Lauterbach", "visits", "New", "York"], ["the", "U.S."]]
    tags = predict_tags(model, tokenizer, sentences)
    for words, got in zip(sentences, tags, strict=True):
        (chunk,) = word_pieces(tokenizer, [words], 16)[0]
        logits = model(torch.tensor([chunk.ids]))[0]
        firsts = dict((w, p) for p, w in chunk.first_pieces())
        labels = model.config.extra["labels"]
        assert got == [labels[int(logits[firsts[w]].argmax())] for w in range(len(words))]
    # a sentence longer than the context is tagged chunk by chunk, every word once
    long = ["Lauterbach"] * 20
    assert len(predict_tags(model, tokenizer, [long])[0]) == 20


def test_text_is_split_into_words_with_their_offsets(tagger):
    model, tokenizer = tagger
    text = "Peter visits the U.S. today"
    words = split_words(tokenizer, text)
    assert [w for w, _, _ in words] == ["Peter", "visits", "the", "U", ".", "S", ".", "today"]
    assert all(text[a:b] == w for w, a, b in words)
    for kind, found, a, b in tag_text(model, tokenizer, text):
        assert text[a:b] == found and kind in ("PER", "LOC")


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
    s = entity_scores(gold, pred)
    # right: PER(0-2) and ORG; predicted 4, expected 3
    assert (s.correct, s.found, s.expected) == (2, 4, 3)
    assert s.precision == 0.5 and s.recall == pytest.approx(2 / 3)
    assert s.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert s.per_type["LOC"] == (0.0, 0.0, 0.0, 1) and s.per_type["PER"] == (1.0, 1.0, 1.0, 1)


def test_entity_scores_equal_seqeval_on_random_tags():
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    for _ in range(20):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(15)]
        pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in s] for s in gold]
        s = entity_scores(gold, pred)
        assert s.precision == pytest.approx(precision_score(gold, pred))
        assert s.recall == pytest.approx(recall_score(gold, pred))
        assert s.f1 == pytest.approx(f1_score(gold, pred))
