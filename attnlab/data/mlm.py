"""Masked-LM pretraining data (BERT, section 3.1): sentence pairs, masking, resumable batches.

Masking: each real (non-special, non-padding) token is *selected* with probability 15%; a
selected token becomes [MASK] with probability 80%, a uniformly random vocabulary token with
10%, and stays unchanged with 10%. The loss is taken on selected positions only (``labels``
holds the original id there and -100 elsewhere). Keeping 10% unchanged and corrupting 10%
stops the model from learning that only [MASK] positions matter, since [MASK] never occurs
in fine-tuning.

Next-sentence prediction (optional): sentence B follows A in the text half of the time
(label 0) and is a random sentence otherwise (label 1), framed ``[CLS] A [SEP] B [SEP]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.data.stream import MaskedLMBatch, SeededBatches
from attnlab.errors import BadInput

IGNORE = -100  # label of positions without a loss (PyTorch's cross-entropy convention)


def mask_tokens(ids: Tensor, maskable: Tensor, mask_id: int, vocab_size: int,
                generator: torch.Generator | None = None, select: float = 0.15,
                to_mask: float = 0.8, to_random: float = 0.1) -> tuple[Tensor, Tensor]:
    """``ids (batch, seq)``, ``maskable (batch, seq)`` bool -> ``(inputs, labels)``."""
    u = torch.rand(ids.shape, generator=generator)
    selected = (u < select) & maskable
    v = torch.rand(ids.shape, generator=generator)  # which of the three fates
    inputs = ids.clone()
    inputs[selected & (v < to_mask)] = mask_id
    randomised = selected & (v >= to_mask) & (v < to_mask + to_random)
    inputs[randomised] = torch.randint(vocab_size, ids.shape, generator=generator)[randomised]
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE))
    return inputs, labels


class MLMBatches(SeededBatches):
    """Endless ``(ids, token_type_ids, attention_mask, labels, nsp_labels)`` batches.

    ``sentences``: token ids of consecutive sentences (no specials). Each row starts at a
    random sentence and takes the following ones while they fit: ``[CLS] A [SEP]`` filling
    ``max_len``, or with ``nsp`` ``[CLS] A [SEP] B [SEP]`` with A and B about half each. Row
    contents for step n depend only on ``(seed, n)``, so a resumed run sees the same batches.
    """

    def __init__(self, sentences: list[list[int]], tokenizer, max_len: int, batch_size: int,
                 seed: int = 0, nsp: bool = False, select: float = 0.15):
        sentences = [s for s in sentences if s]
        if len(sentences) < 2:
            raise BadInput("masked-LM data needs at least two non-empty sentences")
        self.sentences, self.tok = sentences, tokenizer
        self.max_len, self.batch_size, self.seed = max_len, batch_size, seed
        self.nsp, self.select = nsp, select

    def _take(self, start: int, budget: int) -> tuple[list[int], int]:
        """Sentences from ``start`` on while they fit in ``budget`` (the first is cut), and the
        index of the sentence after the last one taken."""
        out: list[int] = []
        i = start
        while i < len(self.sentences) and (not out or len(out) + len(self.sentences[i]) <= budget):
            out += self.sentences[i]
            i += 1
        return out[:budget], i

    def _row(self, g: torch.Generator) -> tuple[list[int], list[int], int]:
        n = len(self.sentences)
        start = int(torch.randint(n, (1,), generator=g))
        tok = self.tok
        if not self.nsp:
            a, _ = self._take(start, self.max_len - 2)
            return [tok.cls_id, *a, tok.sep_id], [0] * (len(a) + 2), 0
        a, after_a = self._take(start, (self.max_len - 3) // 2)
        follows = after_a < n and bool(torch.rand((), generator=g) < 0.5)
        b_start = after_a if follows else int(torch.randint(n, (1,), generator=g))
        b, _ = self._take(b_start, self.max_len - 3 - len(a))
        ids = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1), 0 if follows else 1

    def batch(self, n: int) -> MaskedLMBatch:
        """The global batch number ``n``, this rank's rows of it."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + n)
        rows = [self._row(g) for _ in range(self.batch_size)]
        width = max(len(r[0]) for r in rows)
        ids = torch.full((len(rows), width), self.tok.pad_id, dtype=torch.long)
        types = torch.zeros_like(ids)
        attention = torch.zeros_like(ids)
        for i, (r, t, _) in enumerate(rows):
            ids[i, : len(r)], types[i, : len(t)], attention[i, : len(r)] = (
                torch.tensor(r), torch.tensor(t), 1)
        maskable = attention.bool() & ~torch.isin(ids, torch.tensor(self.tok.special_ids))
        inputs, labels = mask_tokens(ids, maskable, self.tok.mask_id, self.tok.vocab_size, g,
                                     self.select)
        nsp = torch.tensor([r[2] for r in rows])
        part = slice(self.rank, None, self.world)
        return MaskedLMBatch(inputs[part], types[part], attention[part], labels[part], nsp[part])


