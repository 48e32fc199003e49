"""WordPiece (BERT's tokenizer) through the ``tokenizers`` library.

Text is normalised (optionally lower-cased, accents stripped with it), split on whitespace and
punctuation, then each word is cut greedily into the longest vocabulary pieces, later pieces
marked ``##``: "embeddings" -> ``em ##bed ##ding ##s``. Inputs are framed as BERT expects:

    single:  [CLS] A [SEP]              token types 0 … 0
    pair:    [CLS] A [SEP] B [SEP]      token types 0 … 0 1 … 1

A vocabulary is learned (:func:`learn_wordpiece`) by merging the pair of pieces with the
highest count(ab) / (count(a)·count(b)), where BPE merges the most frequent pair.

The ids are the vocabulary's own ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 in the
uncased English vocabulary), so a pretrained model's embedding rows line up.

RoBERTa frames its byte-level BPE the same way with other names, ``<s> A </s>`` and
``<s> A </s></s> B </s>`` (all token types 0), so :class:`RobertaTokenizer` is this class with
RoBERTa's special tokens; the framing comes from its ``tokenizer.json``'s post-processor.
"""

from __future__ import annotations

import heapq
import json
import os
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from attnlab.errors import BadInput, MissingFile
from attnlab.files import read_json, read_lines, read_text
from attnlab.tokenizers.base import Tokenizer
from attnlab.tokenizers.bpe import backend_from_str

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# how a pair longer than its limit is cut, as transformers' tokenizers name it: a token at a
# time from the longer of the two texts, or from the second only
PAIR_TRUNCATIONS = ("longest_first", "only_second")


def learn_wordpiece(words: dict[str, int], size: int,
                    min_frequency: int = 1) -> tuple[list[str], list[tuple[str, str]]]:
    """WordPiece's vocabulary of at most ``size`` pieces (the alphabet is kept whole) from word
    counts, and the merges that made it, in order.

    Each word starts as its characters, every one after the first written as a continuation
    piece: "hugs" -> ``h ##u ##g ##s``. The alphabet (in code-point order) is every character
    seen, and ``##c`` for every character seen after a word's first. Then, while the vocabulary
    has room, the pair of adjacent pieces (within a word) with the highest score is merged,
    everywhere, left to right (``hu`` + ``##g`` -> ``hug``, ``##g`` + ``##s`` -> ``##gs``):

        score(a, b) = count(ab) / (count(a) · count(b))

    counted over the corpus as it stands after the merges so far (a word seen n times counts
    n times). BPE merges the most frequent pair, count(ab); dividing by the parts' counts
    prefers pairs whose parts seldom occur apart. Ties go to the pair seen more often, then to
    the first in string order (a, then b), so the result never depends on dict order. Pairs
    seen fewer than ``min_frequency`` times are not merged."""
    split = [[w[0]] + ["##" + c for c in w[1:]] for w in words if w]
    freq = [n for w, n in words.items() if w]
    alphabet = sorted({c for w in words for c in w} | {s for ws in split for s in ws[1:]})
    symbols: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # may hold stale words
    touching: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)  # symbol -> its pairs

    def count(ws: list[str], n: int, i: int) -> None:  # add (n > 0) or remove a word's counts
        for s in ws:
            symbols[s] += n
        for p in pairwise(ws):
            pairs[p] += n
            if n > 0:
                where[p].add(i)
                touching[p[0]].add(p)
                touching[p[1]].add(p)

    def key(p: tuple[str, str]) -> tuple[float, int, tuple[str, str]]:  # smallest wins
        return -pairs[p] / (symbols[p[0]] * symbols[p[1]]), -pairs[p], p

    for i, ws in enumerate(split):
        count(ws, freq[i], i)
    # a lazy heap: every change of a pair's score pushes a new entry, and a popped entry that
    # no longer matches its pair's current key is dropped
    heap = [key(p) for p in pairs]
    heapq.heapify(heap)
    vocab, merges = list(alphabet), []
    known = set(vocab)
    while heap and len(vocab) < size:
        entry = heapq.heappop(heap)
        a, b = p = entry[2]
        if pairs[p] < max(min_frequency, 1) or entry != key(p):
            continue
        merged = a + b[2:]  # b is never a word's first piece: it always starts with ##
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(p)):
            ws, out, j = split[i], [], 0
            while j < len(ws):
                if j + 1 < len(ws) and ws[j] == a and ws[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(ws[j])
                    j += 1
            if len(out) < len(ws):
                count(ws, -freq[i], i)
                count(out, freq[i], i)
                changed.update(pairwise(ws), pairwise(out))
                split[i] = out
        merges.append(p)
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        for s in (a, b):  # their counts fell: every pair holding them scores anew
            changed |= touching[s]
        for q in changed:
            if pairs[q] > 0:
                heapq.heappush(heap, key(q))
    return vocab, merges


class WordPieceTokenizer(Tokenizer):
    """attnlab's :class:`Tokenizer` interface (bos = [CLS], eos = [SEP]), plus BERT's
    ``encode_pair`` and ``batch`` (padded tensors with token types and attention mask)."""

    kind = "wordpiece"
    specials = SPECIAL  # the vocabulary's pad, unk, cls, sep and mask tokens

    def __init__(self, backend: HFTokenizer):
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        ids = {t: backend.token_to_id(t) for t in self.specials}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise BadInput(f"{self.kind} vocabulary lacks the special token(s) {missing}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids.values()
        self.bos_id, self.eos_id = self.cls_id, self.sep_id
        self.special_ids = sorted(ids.values())

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, tokens: list[str], lowercase: bool = True) -> WordPieceTokenizer:
        """From a ``vocab.txt``'s tokens (one per line; the line number is the id)."""
        missing = [t for t in SPECIAL if t not in tokens]
        if missing:
            raise BadInput(f"WordPiece vocabulary lacks the special token(s) {missing}")
        backend = HFTokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)},
                                               unk_token="[UNK]"))
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        index = {t: i for i, t in enumerate(tokens)}
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", index["[CLS]"]), ("[SEP]", index["[SEP]"])])
        # specials are matched whole in text ("[MASK]" -> 103) and skipped when decoding
        backend.add_special_tokens(SPECIAL)
        return cls(backend)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> WordPieceTokenizer:
        """From ``tokenizer.json``, ``vocab.txt``, or a model folder holding either (its
        ``tokenizer_config.json`` says whether to lower-case)."""
        path = Path(path)
        if path.is_dir():
            for name in ("tokenizer.json", "vocab.txt"):
                if (path / name).exists():
                    return cls.from_file(path / name)
            raise MissingFile(f"{path}: no tokenizer.json or vocab.txt")
        if not path.exists():
            raise MissingFile(f"tokenizer file not found: {path}")
        if path.suffix == ".json":
            data = read_json(path, "tokenizer JSON")
            try:
                if data.get("type") == cls.kind:  # attnlab's own save()
                    return cls.from_dict(data)
                return cls(backend_from_str(json.dumps(data)))
            except KeyError as e:
                raise BadInput(f"{path}: missing field {e}") from None
            except BadInput as e:
                raise BadInput(f"{path}: {e}") from None
        lowercase = True
        config = path.parent / "tokenizer_config.json"
        if config.exists():
            lowercase = bool(read_json(config).get("do_lower_case", True))
        tokens = read_text(path, "vocabulary file").splitlines()
        try:
            return cls.from_vocab(tokens, lowercase=lowercase)
        except BadInput as e:
            raise BadInput(f"{path}: {e}") from None

    @classmethod
    def train(cls, files: list[str | os.PathLike], vocab_size: int = 8000,
              lowercase: bool = True, min_frequency: int = 1) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary from text files (plain or ``.gz``; the specials take
        ids 0–4) by WordPiece's score, :func:`learn_wordpiece`. Words are what BERT's
        normaliser and pre-tokenizer make of each line."""
        backend = HFTokenizer(models.WordPiece(unk_token="[UNK]"))  # only to cut the words
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        words: Counter[str] = Counter()
        for path in files:
            for line in read_lines(path):
                text = backend.normalizer.normalize_str(line)
                words.update(w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text))
        vocab, _ = learn_wordpiece(words, vocab_size - len(SPECIAL), min_frequency)
        return cls.from_vocab(SPECIAL + vocab, lowercase=lowercase)

    # --- encoding --------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def tokenize(self, text: str) -> list[str]:
        """Pieces without the [CLS]/[SEP] frame."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of the pieces; ``add_bos``/``add_eos`` frame them as ``[CLS] … [SEP]``."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return ([self.cls_id] if add_bos else []) + ids + ([self.sep_id] if add_eos else [])

    def encode_single(self, text: str) -> list[int]:
        """One sequence as BERT sees it, ``[CLS] text [SEP]``, framed by the vocabulary's own
        template (as :meth:`batch` and :meth:`encode_pair` are)."""
        return self.backend.encode(text).ids

    def encode_pair(self, a: str, b: str, max_len: int | None = None,
                    truncation: str = "longest_first") -> tuple[list[int], list[int]]:
        """``[CLS] a [SEP] b [SEP]`` (RoBERTa: ``<s> a </s></s> b </s>``) and its token types;
        with ``max_len``, cut to it as transformers' tokenizers cut a pair: ``longest_first``
        takes a token at a time from the longer text, ``only_second`` only from ``b``."""
        if max_len is None:
            enc = self.backend.encode(a, b)
            return enc.ids, enc.type_ids
        if truncation not in PAIR_TRUNCATIONS:
            raise BadInput(f"truncation {truncation!r} is not one of {', '.join(PAIR_TRUNCATIONS)}")
        self.backend.enable_truncation(max_len, strategy=truncation)
        try:
            enc = self.backend.encode(a, b)
        except Exception as e:  # the tokenizers library's: the second text cannot give enough
            raise BadInput(f"a pair of {max_len} tokens at most cannot be cut {truncation} "
                           f"({e})") from None
        finally:
            self.backend.no_truncation()
        return enc.ids, enc.type_ids

    def batch(self, texts: list[str], pairs: list[str] | None = None,
              max_len: int = 512) -> dict[str, torch.Tensor]:
        """Right-padded ``ids``, ``token_type_ids``, ``attention_mask`` (batch, longest ≤
        max_len); a pair is truncated longest-first, as BERT's tokenizers do."""
        self.backend.enable_truncation(max_len)
        try:
            encs = (self.backend.encode_batch(texts) if pairs is None
                    else self.backend.encode_batch(list(zip(texts, pairs, strict=True))))
        finally:
            self.backend.no_truncation()
        width = max(len(e.ids) for e in encs)
        out = {k: torch.zeros(len(encs), width, dtype=torch.long)
               for k in ("ids", "token_type_ids", "attention_mask")}
        out["ids"].fill_(self.pad_id)
        for row, e in enumerate(encs):
            n = len(e.ids)
            out["ids"][row, :n] = torch.tensor(e.ids)
            out["token_type_ids"][row, :n] = torch.tensor(e.type_ids)
            out["attention_mask"][row, :n] = 1
        return out

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    # --- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "tokenizer": json.loads(self.backend.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordPieceTokenizer:
        return cls(backend_from_str(json.dumps(data["tokenizer"]), "wordpiece tokenizer"))


class RobertaTokenizer(WordPieceTokenizer):
    """RoBERTa's byte-level BPE from its ``tokenizer.json``, behind the same encoder interface
    (bos = ``<s>``, eos = ``</s>``; ``encode_single``, ``encode_pair``, ``batch``)."""

    kind = "roberta-bpe"
    specials = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]


def encoder_tokenizer(folder: Path) -> WordPieceTokenizer:
    """The tokenizer of a Hugging Face encoder folder: RoBERTa's when its ``tokenizer.json``
    holds a BPE model, else WordPiece (``tokenizer.json`` or ``vocab.txt``)."""
    path = folder / "tokenizer.json"
    if path.exists():
        model = read_json(path, "tokenizer JSON").get("model")
        if isinstance(model, dict) and model.get("type") == "BPE":
            return RobertaTokenizer.from_file(path)
    return WordPieceTokenizer.from_file(folder)
