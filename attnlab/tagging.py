"""Named-entity recognition with an encoder: one BIO tag per word, read off the word's first
subword (Devlin et al., 2019, section 5.3).

    words     EU      rejects      German    call
    pieces    [CLS] eu  rejects  german  call [SEP]       (an uncased WordPiece vocabulary)
    labels    -100  B-ORG O      B-MISC  O    -100        training: the loss ignores -100
    logits    (batch, seq, num_labels) from BERT's ``tokens`` head; a word's tag is the argmax
              at its first piece

A word that splits into several pieces (``Lauterbach`` → ``lauter ##bach``) is labelled at
``lauter`` only; the loss ignores ``##bach``, as transformers' ``run_ner.py`` does with
``label_all_tokens=False``. Sentences are split into words as BERT's pre-tokenizer splits
them (whitespace, then punctuation apart), so a word's pieces are those the whole text
would give. A sentence longer than the model's context is tagged in chunks of whole words.

Entities are read from tags as conlleval and seqeval's default mode read them
(:func:`entities`), and scored at the entity level in :func:`attnlab.metrics.entity_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

IGNORE = -100  # the label of a position the loss skips (cross_entropy's ignore_index)


def entities(tags: list[str] | tuple[str, ...]) -> list[tuple[str, int, int]]:
    """Entity spans ``(type, start, end)`` (``end`` exclusive) of a BIO tag sequence.

    ``B-X`` always begins an entity; ``I-X`` continues the entity before it if that one is of
    type X, otherwise it begins one; ``O`` ends any entity.
    """
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, name = tag.partition("-")
        if kind is not None and (prefix != "I" or name != kind):  # the open entity ends
            spans.append((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = name, i
    if kind is not None:
        spans.append((kind, start, len(tags)))
    return spans


@dataclass(frozen=True)
class Pieces:
    """One chunk of a sentence as the model reads it: ``ids`` framed ``[CLS] … [SEP]`` and,
    for each position, the index of its word in the sentence (None for [CLS] and [SEP])."""

    ids: list[int]
    word_of: list[int | None]

    def first_pieces(self) -> list[tuple[int, int]]:
        """``(position, word)`` of each word's first piece."""
        seen, out = set(), []
        for pos, word in enumerate(self.word_of):
            if word is not None and word not in seen:
                seen.add(word)
                out.append((pos, word))
        return out

    def labels(self, word_labels: list[int]) -> list[int]:
        """The training labels: a word's label at its first piece, :data:`IGNORE` elsewhere."""
        out = [IGNORE] * len(self.ids)
        for pos, word in self.first_pieces():
            out[pos] = word_labels[word]
        return out


def word_pieces(tokenizer, sentences: list[list[str]], max_len: int) -> list[list[Pieces]]:
    """Each sentence (a list of words) as chunks of whole words whose pieces fit ``max_len``
    with the frame; a single word longer than that keeps its first ``max_len − 2`` pieces."""
    encodings = tokenizer.backend.encode_batch(sentences, is_pretokenized=True,
                                               add_special_tokens=False)
    room = max_len - 2
    out = []
    for words, enc in zip(sentences, encodings, strict=True):
        per_word: list[list[int]] = [[] for _ in words]
        for piece, word in zip(enc.ids, enc.word_ids, strict=True):
            if word is not None:
                per_word[word].append(piece)
        chunks, ids, word_of = [], [], []
        for w, pieces in enumerate(per_word):
            pieces = pieces[:room] or [tokenizer.unk_id]  # a word of no pieces: one [UNK]
            if len(ids) + len(pieces) > room:
                chunks.append(_framed(tokenizer, ids, word_of))
                ids, word_of = [], []
            ids += pieces
            word_of += [w] * len(pieces)
        chunks.append(_framed(tokenizer, ids, word_of))
        out.append(chunks)
    return out


def _framed(tokenizer, ids: list[int], word_of: list[int]) -> Pieces:
    return Pieces([tokenizer.cls_id, *ids, tokenizer.sep_id], [None, *word_of, None])


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)`` right-padded to the longest row: ``(batch, seq)`` each."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.no_grad()
def predict_tags(model: nn.Module, tokenizer, sentences: list[list[str]],
                 batch_size: int = 32, max_len: int | None = None) -> list[list[str]]:
    """The tag of every word of every sentence: the argmax of the ``tokens`` head's logits at
    the word's first piece, named by ``model.config.extra["labels"]``."""
    labels = model.config.extra.get("labels") or [str(i) for i in range(model.config.num_labels)]
    max_len = max_len or model.config.max_len - model.config.position_offset
    device = next(model.parameters()).device
    chunks = [(s, c) for s, parts in enumerate(word_pieces(tokenizer, sentences, max_len))
              for c in parts]
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i][1].ids))  # little padding
    tags = [["O"] * len(words) for words in sentences]
    for start in range(0, len(order), batch_size):
        batch = [chunks[i] for i in order[start : start + batch_size]]
        ids, mask = padded([c.ids for _, c in batch], tokenizer.pad_id)
        best = model(ids.to(device), attention_mask=mask.to(device)).argmax(-1).cpu()
        for row, (s, chunk) in enumerate(batch):
            for pos, word in chunk.first_pieces():
                tags[s][word] = labels[int(best[row, pos])]
    return tags


def split_words(tokenizer, text: str) -> list[tuple[str, int, int]]:
    """``(word, start, end)`` character spans of ``text`` as the tokenizer's pre-tokenizer
    splits it (BERT: whitespace, then punctuation on its own)."""
    pre = tokenizer.backend.pre_tokenizer
    if pre is None:
        return [(w, 0, 0) for w in text.split()]
    return [(w, a, b) for w, (a, b) in pre.pre_tokenize_str(text)]


def tag_text(model: nn.Module, tokenizer, text: str) -> list[tuple[str, str, int, int]]:
    """The entities of a raw text: ``(type, text, start, end)`` with character offsets."""
    words = split_words(tokenizer, text)
    if not words:
        return []
    tags = predict_tags(model, tokenizer, [[w for w, _, _ in words]])[0]
    return [(kind, text[words[a][1] : words[b - 1][2]], words[a][1], words[b - 1][2])
            for kind, a, b in entities(tags)]
