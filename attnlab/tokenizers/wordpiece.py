"""WordPiece (BERT's tokenizer) through the ``tokenizers`` library.

Text is normalised (optionally lower-cased, accents stripped with it), split on whitespace and
punctuation, then each word is cut greedily into the longest vocabulary pieces, later pieces
marked ``##``: "embeddings" -> ``em ##bed ##ding ##s``. Inputs are framed as BERT expects:

    single:  [CLS] A [SEP]              token types 0 … 0
    pair:    [CLS] A [SEP] B [SEP]      token types 0 … 0 1 … 1

The ids are the vocabulary's own ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 in the
uncased English vocabulary), so a pretrained model's embedding rows line up.

RoBERTa frames its byte-level BPE the same way with other names, ``<s> A </s>`` and
``<s> A </s></s> B </s>`` (all token types 0), so :class:`RobertaTokenizer` is this class with
RoBERTa's special tokens; the framing comes from its ``tokenizer.json``'s post-processor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from attnlab.errors import BadInput, MissingFile
from attnlab.files import read_json, read_text
from attnlab.tokenizers.base import Tokenizer
from attnlab.tokenizers.bpe import backend_from_str

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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
    def train(cls, files: list[str], vocab_size: int = 8000,
              lowercase: bool = True) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary from text files (the specials take ids 0–4)."""
        backend = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.train([str(f) for f in files], trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False))
        vocab = backend.get_vocab()
        return cls.from_vocab(sorted(vocab, key=vocab.get), lowercase=lowercase)

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

    def encode_pair(self, a: str, b: str) -> tuple[list[int], list[int]]:
        """``[CLS] a [SEP] b [SEP]`` and its token types."""
        enc = self.backend.encode(a, b)
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
