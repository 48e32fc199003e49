"""Learning a vocabulary: WordPiece merges by count(ab) / (count(a)·count(b)), BPE by count(ab).

The reference is a small corpus worked by hand (below), where the two rules' first merges
differ. transformers' and tokenizers' WordPieceTrainer is no reference for the score: it trains
by BPE's pair frequency and only writes the pieces with ``##``.

The corpus: hug ×10, pug ×5, pun ×12, bun ×4, hugs ×5.

WordPiece, words as pieces: h ##u ##g (10), p ##u ##g (5), p ##u ##n (12), b ##u ##n (4),
h ##u ##g ##s (5). Ties: the higher count(ab), then the first pair in string order.

 1. counts h 15, p 17, b 4, ##u 36, ##g 20, ##n 16, ##s 5. Every pair holding ##u scores
    count(ab)/(count(a)·36) = 1/36 (h ##u 15/(15·36), ##u ##g 20/(36·20), ...), but
    ##g ##s: 5/(20·5) = 1/20                                             -> merge ##g ##s = ##gs
 2. ##g 15, ##s 0, ##gs 5: h ##u 15/(15·36), ##u ##g 15/(36·15), p ##u 17/(17·36),
    ##u ##n 16/(36·16), b ##u 4/(4·36), ##u ##gs 5/(36·5): all 1/36; p ##u is seen most (17)
                                                                         -> merge p ##u = pu
 3. ##u 19, pu 17: h ##u 15/(15·19) = 1/19, b ##u 4/(4·19) = 1/19, ##u ##gs 5/(19·5) = 1/19,
    pu ##n 12/(17·16) = 3/68, ##u ##g 10/(19·15) = 2/57, ...; of the 1/19s h ##u is seen most
                                                                         -> merge h ##u = hu
 4. ##u 4, hu 15: b ##u 4/(4·4) = 1/4 (hu ##gs 5/(15·5) = 1/15, ##u ##n 4/(4·16) = 1/16)
                                                                         -> merge b ##u = bu
 5. hu ##gs 5/(15·5) = 1/15, bu ##n 4/(4·16) = 1/16, hu ##g 10/(15·15) = 2/45,
    pu ##n 12/(17·16) = 3/68, pu ##g 5/(17·15) = 1/51                    -> merge hu ##gs = hugs
 6. hu 10: hu ##g 10/(10·15) = 1/15 > bu ##n 1/16 > pu ##n 3/68 > pu ##g 1/51
                                                                         -> merge hu ##g = hug
 7. ##g 5: bu ##n 4/(4·16) = 1/16 > pu ##g 5/(17·5) = 1/17 > pu ##n 12/(17·16) = 3/68
                                                                         -> merge bu ##n = bun
 8. ##n 12: pu ##n 12/(17·12) = 1/17 = pu ##g 5/(17·5); pu ##n is seen more (12 > 5)
                                                                         -> merge pu ##n = pun
 9. pu 5, ##g 5: pu ##g 5/(5·5) = 1/5                                    -> merge pu ##g = pug
    No pair is left.

BPE (byte-level, one word a line), the most frequent pair:
 1. h u 15, u g 20, p u 17, u n 16, b u 4, g s 5                          -> u g
 2. h ug 15, p ug 5, p u 12, u n 16, b u 4, ug s 5                        -> u n
 3. h ug 15, p ug 5, p un 12, b un 4, ug s 5                              -> h ug
 4. p ug 5, p un 12, b un 4, hug s 5                                      -> p un
 5. p ug 5 = hug s 5 (b un 4): tokenizers breaks the tie to the pair of lower ids, the bytes
    before the merges                                                     -> p ug
 6. hug s 5, b un 4                                                       -> hug s
 7. b un 4                                                                -> b un
"""

import json
from collections import Counter
from fractions import Fraction

import pytest

from attnlab.tokenizers import BPETokenizer, WordPieceTokenizer, learn_wordpiece

CORPUS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
WORDPIECE_MERGES = [("##g", "##s"), ("p", "##u"), ("h", "##u"), ("b", "##u"), ("hu", "##gs"),
                    ("hu", "##g"), ("bu", "##n"), ("pu", "##n"), ("pu", "##g")]
BPE_MERGES = [["u", "g"], ["u", "n"], ["h", "ug"], ["p", "un"], ["p", "ug"], ["hug", "s"],
              ["b", "un"]]
# every character alone, and after a word's first as ##c (h, p and b never come later)
ALPHABET = ["##g", "##n", "##s", "##u", "b", "g", "h", "n", "p", "s", "u"]
LEARNED = ["##gs", "pu", "hu", "bu", "hugs", "hug", "bun", "pun", "pug"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_wordpiece_merges_by_score_as_worked_by_hand():
    vocab, merges = learn_wordpiece(CORPUS, 100)
    assert merges == WORDPIECE_MERGES
    assert vocab == ALPHABET + LEARNED


def test_bpe_merges_by_frequency_as_worked_by_hand():
    lines = [w for w, n in CORPUS.items() for _ in range(n)]
    tok = BPETokenizer.train(lines, vocab_size=300)
    assert json.loads(tok.backend.to_str())["model"]["merges"] == BPE_MERGES
    assert tok.vocab_size == 4 + 256 + len(BPE_MERGES)  # specials, bytes, merges
    # the first merges differ: BPE takes u g (seen 20 times), WordPiece ##g ##s (score 1/20)
    assert BPE_MERGES[0] != [a.removeprefix("##") for a in WORDPIECE_MERGES[0]]


def test_trained_vocabulary_stops_at_its_size_and_keeps_its_order(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join([w] * n) for w, n in CORPUS.items()) + "\n")
    full = WordPieceTokenizer.train([corpus], vocab_size=100)
    vocab = full.backend.get_vocab()
    assert sorted(vocab, key=vocab.get) == SPECIAL + ALPHABET + LEARNED
    # no ##b in the alphabet (b only starts words), so "gub" has no pieces: one [UNK]
    assert full.tokenize("Hugs bun gub") == ["hugs", "bun", "[UNK]"]
    small = WordPieceTokenizer.train([corpus], vocab_size=len(SPECIAL + ALPHABET) + 3)
    vocab = small.backend.get_vocab()
    assert sorted(vocab, key=vocab.get) == SPECIAL + ALPHABET + LEARNED[:3]
    assert small.tokenize("hugs") == ["hu", "##gs"]
    # pairs seen fewer than min_frequency times are never merged (bu ##n: 4)
    often = WordPieceTokenizer.train([corpus], vocab_size=100, min_frequency=5)
    assert "bu" not in often.backend.get_vocab() and "hugs" in often.backend.get_vocab()


def recount_merges(words: dict[str, int], size: int) -> list[tuple[str, str]]:
    """The rule as written, slowly: every step recounts every symbol and pair from scratch and
    compares exact fractions."""
    split = {w: [w[0]] + ["##" + c for c in w[1:]] for w in words}
    alphabet = {c for w in words for c in w} | {s for ws in split.values() for s in ws[1:]}
    merges, vocab = [], set(alphabet)
    while len(vocab) < size:
        symbols, pairs = Counter(), Counter()
        for w, ws in split.items():
            for s in ws:
                symbols[s] += words[w]
            for p in zip(ws, ws[1:], strict=False):
                pairs[p] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-Fraction(pairs[p], symbols[p[0]] * symbols[p[1]]),
                                         -pairs[p], p))
        a, b = best
        for w, ws in split.items():
            out, j = [], 0
            while j < len(ws):
                if ws[j : j + 2] == [a, b]:
                    out.append(a + b[2:])
                    j += 2
                else:
                    out.append(ws[j])
                    j += 1
            split[w] = out
        merges.append(best)
        vocab.add(a + b[2:])
    return merges


@pytest.mark.parametrize("size", [60, 250])
def test_incremental_counts_equal_a_full_recount(size):
    """learn_wordpiece updates its counts merge by merge; on words with doubled letters (the
    pair ##c ##c), shared pieces and ties, its merges are those of a full recount."""
    text = ("the embeddings of the transformers attention heads pass the classes "
            "mississippi assessments possess a successful session bookkeeper bananas "
            "the attention is all you need tokenizers split unbelievable words ") * 3
    words = Counter(text.split()) + Counter("banana bandana cabana".split())
    assert learn_wordpiece(words, size)[1] == recount_merges(words, size)
