"""The tokenizer interface shared by every tokenizer in attnlab.

Special ids are fixed: ``pad = 0``, ``unk = 1``, ``bos = 2``, ``eos = 3``, so models and
tokenizers agree without passing ids around. ``save`` writes JSON (``{"type": ..., ...}``) and
:func:`attnlab.tokenizers.load` reads any of them back.
"""

from __future__ import annotations

import json
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = [PAD, UNK, BOS, EOS]


class Tokenizer(ABC):
    """Text <-> ids. Subclasses define how text splits into pieces and how pieces join."""

    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3
    kind = "base"

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

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.index.get(p, self.unk_id) for p in self.split(text)]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def encode_batch(self, texts: list[str], add_bos: bool = False,
                     add_eos: bool = False) -> list[list[int]]:
        return [self.encode(t, add_bos, add_eos) for t in texts]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
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

    # --- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "vocab": self.vocab}

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (a temporary file renamed into place)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        return cls(data["vocab"])
