"""Byte-level BPE through the ``tokenizers`` library, behind attnlab's tokenizer interface.

Pretrained vocabularies keep their own special ids (GPT-2's ``<|endoftext|>`` is 50256,
SmolLM2's ``<|im_end|>`` is 2), so this tokenizer carries its ids instead of assuming
pad=0, unk=1, bos=2, eos=3.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.errors import BadInput, MissingFile
from attnlab.files import parse_json, read_text
from attnlab.tokenizers.base import Tokenizer


def backend_from_str(text: str, where: str | os.PathLike | None = None) -> HFTokenizer:
    """A ``tokenizers.Tokenizer`` from its JSON; damage is a BadInput naming ``where``."""
    try:
        return HFTokenizer.from_str(text)
    except Exception as e:  # the library raises a bare Exception for any malformed JSON
        prefix = "" if where is None else f"{where}: "
        raise BadInput(f"{prefix}not a readable tokenizer ({e})") from None


class BPETokenizer(Tokenizer):
    """Wraps a ``tokenizers.Tokenizer`` behind attnlab's :class:`Tokenizer` interface."""

    kind = "bpe"

    def __init__(self, backend: HFTokenizer, bos_id: int | None = None,
                 eos_id: int | None = None, pad_id: int | None = None,
                 unk_id: int | None = None):
        self.backend = backend
        self.bos_id, self.eos_id = bos_id, eos_id
        self.pad_id = eos_id if pad_id is None else pad_id
        self.unk_id = unk_id

    @classmethod
    def from_vocab_and_merges(cls, tokens: list[str], merges: list[str], digits: bool = False,
                              **special_ids: int | None) -> BPETokenizer:
        """Byte-level BPE (GPT-2 scheme) from a token list and ``"a b"`` merge lines;
        ``digits`` splits numbers into single digits first (SmolLM's pre-tokenizer)."""
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = HFTokenizer(models.BPE(vocab, pairs))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.pre_tokenizer = (pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]) if digits else byte_level)
        backend.decoder = decoders.ByteLevel()
        special = [t for t in tokens if t.startswith("<|") and t.endswith("|>")]
        backend.add_special_tokens(special)
        return cls(backend, **special_ids)

    @classmethod
    def train(cls, texts, vocab_size: int = 8000, min_frequency: int = 2) -> BPETokenizer:
        """Learn a byte-level BPE vocabulary from an iterable of texts (e.g. source and target
        sides together, for the paper's shared vocabulary). The specials take attnlab's ids:
        <pad> 0, <unk> 1, <bos> 2, <eos> 3. Every byte is in the base alphabet, so nothing is
        ever unknown."""
        backend = HFTokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
            special_tokens=["<pad>", "<unk>", "<bos>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(texts, trainer)
        return cls(backend, bos_id=2, eos_id=3, pad_id=0, unk_id=1)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
        """A ``tokenizer.json`` (Hugging Face format) or one saved by :meth:`save`; special ids
        are found by name (<pad>/<unk>/<bos>/<eos>, or GPT-2's <|endoftext|>)."""
        text = read_text(path, "tokenizer file")
        data = parse_json(text, path, "tokenizer JSON")
        if data.get("type") == cls.kind:
            try:
                return cls.from_dict(data)
            except KeyError as e:
                raise BadInput(f"{path}: missing field {e}") from None
            except BadInput as e:
                raise BadInput(f"{path}: {e}") from None
        backend = backend_from_str(text, path)
        find = backend.token_to_id
        eos = find("<eos>") if find("<eos>") is not None else find("<|endoftext|>")
        bos = find("<bos>") if find("<bos>") is not None else eos
        return cls(backend, bos_id=bos, eos_id=eos, pad_id=find("<pad>"), unk_id=find("<unk>"))

    @classmethod
    def from_gpt2_files(cls, encoder_json: str | os.PathLike,
                        vocab_bpe: str | os.PathLike) -> BPETokenizer:
        """GPT-2's own files: ``encoder.json`` (token -> id) and ``vocab.bpe`` (merges)."""
        try:
            with open(encoder_json, encoding="utf-8") as f:
                encoder = json.load(f)
            with open(vocab_bpe, encoding="utf-8") as f:
                merges = [line.rstrip("\n") for line in f
                          if line.strip() and not line.startswith("#version")]
        except FileNotFoundError as e:
            raise MissingFile(f"GPT-2 tokenizer file not found: {e.filename}") from None
        tokens = [t for t, _ in sorted(encoder.items(), key=lambda kv: kv[1])]
        eos = encoder.get("<|endoftext|>")
        return cls.from_vocab_and_merges(tokens, merges, bos_id=eos, eos_id=eos)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "tokenizer": json.loads(self.backend.to_str()),
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "unk_id": self.unk_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        backend = backend_from_str(json.dumps(data["tokenizer"]), "bpe tokenizer")
        return cls(backend, data.get("bos_id"), data.get("eos_id"), data.get("pad_id"),
                   data.get("unk_id"))

    def save_hf(self, path: str | os.PathLike) -> None:
        """The plain Hugging Face ``tokenizer.json``."""
        self.backend.save(str(path))
