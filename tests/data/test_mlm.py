"""Masked-LM data: the 15% / 80-10-10 masking statistics, framing, next-sentence pairs."""

import torch

from attnlab.data.mlm import IGNORE, MLMBatches, mask_tokens
from attnlab.tokenizers import WordPieceTokenizer

MASK, VOCAB = 4, 30000


def test_masking_statistics_over_many_batches():
    g = torch.Generator().manual_seed(0)
    selected = maskable_total = masked = randomised = unchanged = 0
    for _ in range(100):
        ids = torch.randint(10, VOCAB, (32, 128), generator=g)
        maskable = torch.rand(ids.shape, generator=g) < 0.9  # some positions are special/pad
        inputs, labels = mask_tokens(ids, maskable, MASK, VOCAB, g)
        sel = labels != IGNORE
        assert not sel[~maskable].any()  # specials and padding are never selected
        assert torch.equal(labels[sel], ids[sel])  # the label is the original token
        assert torch.equal(inputs[~sel], ids[~sel])  # unselected positions are untouched
        selected += int(sel.sum())
        maskable_total += int(maskable.sum())
        masked += int((inputs[sel] == MASK).sum())
        unchanged += int((inputs[sel] == ids[sel]).sum())
        randomised += int(((inputs[sel] != MASK) & (inputs[sel] != ids[sel])).sum())
    rates = (selected / maskable_total, masked / selected, randomised / selected,
             unchanged / selected)
    print("selected {:.4f}, [MASK] {:.4f}, random {:.4f}, unchanged {:.4f}".format(*rates))
    for got, want in zip(rates, (0.15, 0.8, 0.1, 0.1), strict=True):
        assert abs(got - want) <= 0.01


def numbered_tokenizer(tmp_path):
    """A WordPiece vocabulary whose words are 'w0'..'w199' (so sentences are traceable)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tmp_path / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i in range(200)]))
    return WordPieceTokenizer.from_file(tmp_path / "vocab.txt")


def test_nsp_pairs_framing_and_labels(tmp_path):
    tok = numbered_tokenizer(tmp_path)
    # sentence k is the three words w(3k), w(3k+1), w(3k+2): "next" is checkable from ids
    sentences = [tok.encode(f"w{3 * k} w{3 * k + 1} w{3 * k + 2}")
                 for k in range(60)]
    # max_len 17: A may hold two sentences (budget 7), so "B follows A" must start after A's
    # last sentence, not after its first
    batches = MLMBatches(sentences, tok, max_len=17, batch_size=400, seed=3, nsp=True,
                         select=0.0)  # no masking: the text itself is checked
    ids, types, attention, labels, nsp = batches.batch(0)
    assert (labels == IGNORE).all()
    follows = two_sentence_a = 0
    for row, t, a, is_random in zip(ids, types, attention, nsp, strict=True):
        real = row[a.bool()].tolist()
        seps = [i for i, x in enumerate(real) if x == tok.sep_id]
        assert real[0] == tok.cls_id and len(seps) == 2 and seps[1] == len(real) - 1
        assert t[: seps[0] + 1].eq(0).all() and t[seps[0] + 1 : len(real)].eq(1).all()
        last_a, first_b = real[seps[0] - 1], real[seps[0] + 1]
        if int(is_random) == 0:  # B continues A: the next sentence's first word
            assert first_b == last_a + 1
            follows += 1
            two_sentence_a += seps[0] - 1 == 6
    assert abs(follows / len(ids) - 0.5) < 0.08
    assert two_sentence_a > 50  # the multi-sentence case is exercised


def test_batches_are_reproducible_and_resume_where_they_left_off(tmp_path):
    tok = numbered_tokenizer(tmp_path)
    sentences = [[10 + (k % 150), 11 + (k % 150)] for k in range(50)]
    a = MLMBatches(sentences, tok, max_len=16, batch_size=4, seed=1)
    it = iter(a)
    first = [next(it) for _ in range(3)]
    b = MLMBatches(sentences, tok, max_len=16, batch_size=4, seed=1)
    b.load_state_dict({"position": 2})
    assert all(torch.equal(x, y) for x, y in zip(next(iter(b)), first[2], strict=True))
    assert not torch.equal(first[0][0], first[1][0])
