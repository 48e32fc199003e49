"""The one tokenizer interface, and the two tokenizers that are only a vocabulary and a rule.

Every tokenizer in attnlab (char, word, byte-level BPE, WordPiece) is a :class:`Tokenizer`:

    encode(text, add_bos=False, add_eos=False) -> list[int]
    decode(ids, skip_special=True) -> str           (stops at eos, drops pad/bos)
    vocab_size, pad_id, unk_id, bos_id, eos_id       (BPE/WordPiece keep a vocabulary's own)
    to_dict() / from_dict() / save(path)              (JSON, {"type": kind, ...})

What a tokenizer makes of a text (characters per token, tokens per word, OOV rate, share of
the vocabulary used) is :func:`text_stats`.

Each subclass registers its ``kind``, so :func:`tokenizer_from_dict` reads any of them back.

Char and word tokenizers learn their vocabulary from text; their special ids are fixed at
``pad = 0``, ``unk = 1``, ``bos = 2``, ``eos = 3``, so models and tokenizers agree without
passing ids around. A piece the vocabulary lacks encodes as ``<unk>``; :meth:`unknown` lists
such pieces, and the commands warn in one line naming them:

    char:  "forty-two" -> f o r t y - t w o
    word:  "forty-two" -> forty - two     (decoding re-attaches hyphens and punctuation)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from attnlab.errors import BadInput

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = [PAD, UNK, BOS, EOS]
KINDS: dict[str, type[Tokenizer]] = {}  # kind -> class, filled as each class is defined


class Tokenizer(ABC):
    """Text <-> ids: the interface every attnlab tokenizer implements."""

    kind: ClassVar[str] = "base"
    pad_id: int | None
    unk_id: int | None
    bos_id: int | None
    eos_id: int | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            KINDS[cls.kind] = cls

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text -> ids, optionally framed by bos and eos."""

    @abstractmethod
    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> text; with ``skip_special``, special tokens are left out."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the tokenizer, as JSON data with a ``type`` key."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer: ...

    def encode_batch(self, texts: list[str], add_bos: bool = False,
                     add_eos: bool = False) -> list[list[int]]:
        return [self.encode(t, add_bos, add_eos) for t in texts]

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (a temporary file renamed into place)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def tokenizer_from_dict(data: dict) -> Tokenizer:
    """Any tokenizer from its :meth:`Tokenizer.to_dict`; malformed data is a BadInput."""
    if not isinstance(data, dict):
        raise BadInput(f"a tokenizer is a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in KINDS:
        raise BadInput(f"unknown tokenizer type {kind!r}; expected one of {sorted(KINDS)}")
    try:
        return KINDS[kind].from_dict(data)
    except KeyError as e:
        raise BadInput(f"{kind} tokenizer: missing field {e}") from None


def pad(seqs: list[list[int]], pad_id: int = 0) -> Tensor:
    """Right-pad id lists into a ``(batch, longest)`` long tensor."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


class VocabTokenizer(Tokenizer):
    """A learned vocabulary plus a rule: subclasses say how text splits into pieces and how
    pieces join back into text."""

    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3

    def __init__(self, vocab: list[str]):
        if vocab[: len(SPECIALS)] != SPECIALS:
            vocab = SPECIALS + [t for t in vocab if t not in SPECIALS]
        self.vocab = vocab
        self.index = {token: i for i, token in enumerate(vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @abstractmethod
    def split(self, text: str) -> list[str]:
        """Text -> pieces."""

    @abstractmethod
    def join(self, pieces: list[str]) -> str:
        """Pieces -> text."""

    def unknown(self, text: str) -> list[str]:
        """The distinct pieces of ``text`` that the vocabulary lacks (they encode as
        ``<unk>``), in order of appearance."""
        return list(dict.fromkeys(p for p in self.split(text) if p not in self.index))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.index.get(p, self.unk_id) for p in self.split(text)]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> text; stops at the first eos and drops pad/bos when ``skip_special``."""
        pieces = []
        for i in ids:
            i = int(i)
            if skip_special and i == self.eos_id:
                break
            if skip_special and i in (self.pad_id, self.bos_id):
                continue
            pieces.append(self.vocab[i] if 0 <= i < len(self.vocab) else UNK)
        return self.join(pieces)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "vocab": self.vocab}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VocabTokenizer:
        vocab = data["vocab"]
        if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
            raise BadInput(f"{cls.kind} tokenizer: vocab must be a list of strings")
        return cls(vocab)


class CharTokenizer(VocabTokenizer):
    """One id per character seen in training; unseen characters map to ``<unk>``."""

    kind = "char"

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        return cls(sorted(chars))

    def split(self, text: str) -> list[str]:
        return list(text)

    def join(self, pieces: list[str]) -> str:
        return "".join(pieces)


_WORD = re.compile(r"\w+|[^\w\s]")
_ATTACH = re.compile(r" ?(-) ?| ([.,!?;:%)\]])|([(\[]) ")


class WordTokenizer(VocabTokenizer):
    """Words and punctuation marks: the ``max_size`` most frequent with count >= ``min_count``.
    decode(encode(text)) == text for text written in the usual spacing."""

    kind = "word"

    @classmethod
    def train(cls, texts: Iterable[str], max_size: int | None = None,
              min_count: int = 1) -> WordTokenizer:
        counts = Counter(tok for t in texts for tok in _WORD.findall(t))
        ranked = sorted((w for w, c in counts.items() if c >= min_count),
                        key=lambda w: (-counts[w], w))
        return cls(ranked[:max_size] if max_size else ranked)

    def split(self, text: str) -> list[str]:
        return _WORD.findall(text)

    def join(self, pieces: list[str]) -> str:
        text = " ".join(pieces)
        return _ATTACH.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)


@dataclass(frozen=True)
class TextStats:
    """What a tokenizer makes of a text: the counts, and the four figures a course compares
    tokenizers by (each ``None`` where its denominator is 0)::

        compression  = characters / tokens         (characters per token)
        fertility    = tokens / words              (words: whitespace-separated)
        OOV rate     = unknown tokens / tokens     (tokens equal to the tokenizer's unk id)
        vocab used   = distinct ids / vocab size
    """

    lines: int
    characters: int  # line ends not counted
    words: int
    tokens: int  # without bos/eos or [CLS]/[SEP]
    unknown: int
    distinct: int
    vocab_size: int

    @property
    def compression(self) -> float | None:
        return self.characters / self.tokens if self.tokens else None

    @property
    def fertility(self) -> float | None:
        return self.tokens / self.words if self.words else None

    @property
    def oov_rate(self) -> float | None:
        return self.unknown / self.tokens if self.tokens else None

    @property
    def vocab_used(self) -> float:
        return self.distinct / self.vocab_size


def text_stats(tok: Tokenizer, lines: Iterable[str]) -> TextStats:
    """Encode each line on its own (as the training commands read text) and count; a tokenizer
    without an unk id (GPT-2's byte-level BPE) counts no unknown tokens."""
    n = characters = words = tokens = unknown = 0
    seen: set[int] = set()
    for line in lines:
        ids = tok.encode(line)
        n += 1
        characters += len(line)
        words += len(line.split())
        tokens += len(ids)
        unknown += sum(i == tok.unk_id for i in ids) if tok.unk_id is not None else 0
        seen.update(ids)
    return TextStats(n, characters, words, tokens, unknown, len(seen), tok.vocab_size)
