"""Extractive QA: the span head against transformers' BertForQuestionAnswering, the windows
against its tokenizer's overflowing windows, answers that cross a window boundary, the
training targets and loss, and SQuAD's scores by hand."""

import json

import pytest
import torch
import transformers

from attnlab import from_pretrained
from attnlab.data.stream import LabelledBatch
from attnlab.errors import BadInput
from attnlab.tasks.qa import Window, answer, best_span, normalize_answer, squad_scores, windows
from attnlab.tasks.qa.data import read_squad, training_rows
from attnlab.tokenizers import WordPieceTokenizer
from attnlab.training.objectives import Span

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["who", "won", "the", "game", "in", "year", "team", "red", "blue", "green", "played",
         "and", "then", "after", "a", "long", "match", "finally", ".", ",", "?", "lions",
         "tigers", "##s", "score", "was", "to"]
CONTEXT = ("the red team played the blue team , and then the green team played a long match "
           "in the year . after a long match the lions finally won the game , the score was "
           "red to blue . then the tigers played the green team in a long match .")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa_vocab")
    (folder / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n")
    return folder


@pytest.fixture(scope="module")
def tok(vocab):
    return WordPieceTokenizer.from_file(vocab / "vocab.txt")


def test_windows_equal_transformers_overflowing_windows(vocab, tok):
    question = "who won the game ?"
    got = windows(tok, question, CONTEXT, max_len=24, stride=6)
    hf = transformers.BertTokenizerFast.from_pretrained(vocab)
    enc = hf(question, CONTEXT, truncation="only_second", max_length=24, stride=6,
             return_overflowing_tokens=True, return_offsets_mapping=True)
    assert len(got) == len(enc["input_ids"]) > 3  # the context needs several windows
    for n, w in enumerate(got):
        assert w.ids == enc["input_ids"][n]
        assert w.types == enc["token_type_ids"][n]
        expected = [tuple(span) if seq == 1 else None
                    for span, seq in zip(enc["offset_mapping"][n], enc.sequence_ids(n),
                                         strict=True)]
        assert w.spans == expected
    # consecutive windows share 6 context tokens
    first = [s for s in got[0].spans if s is not None]
    second = [s for s in got[1].spans if s is not None]
    assert first[-6:] == second[:6]


class Pointer(torch.nn.Module):
    """A stand-in span model: start logit 5 at token ``a``, end logit 5 at token ``b``, 0
    elsewhere; so the best span runs from ``a`` to the first ``b`` after it."""

    def __init__(self, a: int, b: int):
        super().__init__()
        self.a, self.b = a, b
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids, types, mask):
        return 5.0 * (ids == self.a).float(), 5.0 * (ids == self.b).float()


def test_an_answer_across_a_window_boundary_comes_from_the_window_that_holds_it(tok):
    question = "who won the game ?"
    ws = windows(tok, question, CONTEXT, max_len=26, stride=8)
    lions, won = tok.encode("lions")[0], tok.encode("won")[0]
    start_char = CONTEXT.index("lions")
    end_char = CONTEXT.index("won") + 3
    # 18 context tokens a window, 10 new ones each: the second window ends between "lions"
    # and "won", the third holds the whole answer
    holding = [w.position_of(start_char, end_char) is not None for w in ws]
    cut = [any(s is not None and s[0] <= start_char < s[1] for s in w.spans)
           and not h for w, h in zip(ws, holding, strict=True)]
    assert any(holding) and any(cut)  # one window cuts the answer, another holds it whole
    text, score, a, b = answer(Pointer(lions, won), tok, question, CONTEXT, max_len=24,
                               stride=6)
    assert (text, a, b) == ("lions finally won", start_char, end_char)
    assert score == 10.0


def test_training_targets_point_at_the_answer_or_at_cls(tok):
    from attnlab.tasks.qa import Question

    start = CONTEXT.index("lions finally won")
    q = Question("q1", 0, "who won the game ?", CONTEXT, ("lions finally won",), (start,))
    rows = training_rows([q], tok, 24, 6)
    ws = windows(tok, q.question, CONTEXT, 24, 6)
    assert len(rows) == len(ws)
    for (ids, types, a, b), w in zip(rows, ws, strict=True):
        assert ids == w.ids and types == w.types
        if (a, b) == (0, 0):
            assert w.position_of(start, start + 17) is None
        else:
            assert CONTEXT[w.spans[a][0] : w.spans[b][1]] == "lions finally won"


def test_span_logits_equal_transformers_with_copied_weights(tmp_path):
    config = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=64)
    torch.manual_seed(0)
    theirs = transformers.BertForQuestionAnswering(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.config.head == "qa"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (2, 19), generator=g)
    types = torch.cat([torch.zeros(2, 7), torch.ones(2, 12)], 1).long()
    mask = torch.ones(2, 19, dtype=torch.long)
    mask[1, 15:] = 0
    with torch.no_grad():
        expected = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask)
        start, end = ours(ids, types, mask)
    assert (start - expected.start_logits).abs().max() <= 1e-4
    assert (end - expected.end_logits).abs().max() <= 1e-4


def test_the_span_loss_is_over_real_tokens_and_the_same_packed_or_not(tmp_path):
    """The training loss (packed: nothing computed for padding) against a cross-entropy by
    hand over each window's real positions of transformers' logits; a padded window's loss
    is the one it has alone."""
    config = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    theirs = transformers.BertForQuestionAnswering(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path).train()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 40, (3, 17), generator=g)
    types = torch.cat([torch.zeros(3, 6), torch.ones(3, 11)], 1).long()
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 9:] = 0
    labels = torch.tensor([[7, 10], [8, 11], [0, 0]])
    with torch.no_grad():
        ref = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask)
    by_hand = []
    for i in range(3):
        n = int(mask[i].sum())
        by_hand.append(sum(torch.nn.functional.cross_entropy(logits[i, None, :n],
                                                             labels[i, j:j + 1])
                           for j, logits in enumerate((ref.start_logits, ref.end_logits))) / 2)
    sums = Span().loss(ours, LabelledBatch(ids, types, mask, labels))
    assert sums.tokens == 3
    assert abs(sums.loss.item() - float(sum(by_hand))) <= 1e-5
    n = int(mask[1].sum())
    alone = Span().loss(ours, LabelledBatch(ids[1:2, :n], types[1:2, :n], mask[1:2, :n],
                                            labels[1:2]))
    assert abs(alone.loss.item() - float(by_hand[1])) <= 1e-5


def test_squad_scores_by_hand():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    em, f1 = squad_scores(["Denver Broncos", "Denver Broncos team", "Carolina"],
                          [["the Denver Broncos"], ["the Denver Broncos", "Broncos"], ["x"]])
    # 1: exact; 2: P = 2/3, R = 1 against the first reference -> F1 0.8; 3: nothing
    assert em == pytest.approx(100 / 3)
    assert f1 == pytest.approx(100 * (1 + 0.8 + 0) / 3)


@pytest.mark.parametrize("text, start, says", [
    ("team", 0, r"'q7': answer 'team' is not at character 0"),
    ("won", -3, r"'q7': answer 'won' is not at character -3"),
    ("", 4, r"'q7': an empty answer"),
])
def test_a_squad_answer_not_where_it_says_is_named(tmp_path, text, start, says):
    bad = {"data": [{"title": "t", "paragraphs": [{"context": "red team won", "qas": [
        {"id": "q7", "question": "who?", "answers": [{"text": text, "answer_start": start}]}]}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(BadInput, match=r"squad.json: article 0: .*" + says):
        read_squad(path)


def test_the_best_span_is_the_best_pair_that_qualifies():
    """Against every pair by brute force: a start in the context, an end at or after it, at
    most ``max_answer_len`` tokens, on random logits where [CLS] (outside the context) holds
    the highest start and end."""
    g = torch.Generator().manual_seed(0)
    spans = [None] * 3 + [(10 * i, 10 * i + 5) for i in range(8)] + [None]  # context: 3-10
    window = Window(list(range(12)), [0] * 3 + [1] * 9, spans)
    inverted = 0
    for _ in range(40):
        start, end = torch.randn(12, generator=g), torch.randn(12, generator=g)
        start[0] = end[0] = 10.0
        inverted += int(start[3:11].argmax() > end[3:11].argmax())
        for limit in (1, 3, 30):
            score, i, j = max((float(start[i] + end[j]), i, j) for i in range(3, 11)
                              for j in range(i, min(11, i + limit)))
            got = best_span(start, end, window, n_best=12, max_answer_len=limit)
            assert got[1:] == (spans[i][0], spans[j][1]) and abs(got[0] - score) < 1e-6
    assert inverted > 5  # the best start after the best end happened, and was not taken
