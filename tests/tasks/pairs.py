"""Small encoders with transformers' own tokenizers beside them, for the pair and
multiple-choice tests: a BERT (WordPiece from a vocab.txt) and a RoBERTa (byte-level BPE),
each a folder ``attnlab.load`` reads and a tokenizer transformers builds from the same files,
with no download."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import ByteLevelBPETokenizer

from attnlab import BERT, ModelConfig
from attnlab.storage import save_model_dir
from attnlab.tokenizers import WordPieceTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "man", "woman", "dog", "cat", "is", "was", "eating", "sleeping", "on",
         "in", "park", "sofa", "food", "bread", "great", "awful", "film", "and", "not", "who",
         "which", "one", "colour", "red", "blue", "green", "horse", "bird", "fish", "mouse",
         "?", ".", "yellow", "really", "quite", "plot", "music", "cast", "##s", "##ing"]


def bert_encoder(folder: Path, max_len: int = 64, head: str = "none") -> Path:
    """A random bert-tiny whose WordPiece vocabulary is ``folder/vocab/vocab.txt`` (its special
    ids the vocabulary's own), as an attnlab model folder ``folder/model``."""
    (folder / "vocab").mkdir(parents=True, exist_ok=True)
    (folder / "vocab" / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n")
    tok = WordPieceTokenizer.from_file(folder / "vocab" / "vocab.txt")
    config = ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size, max_len=max_len,
                                     pad_id=tok.pad_id, unk_id=tok.unk_id, bos_id=tok.cls_id,
                                     eos_id=tok.sep_id, head=head)
    torch.manual_seed(0)
    return save_model_dir(folder / "model", BERT(config), config, {"text": tok.to_dict()})


def bert_reference(folder: Path) -> transformers.PreTrainedTokenizerBase:
    """transformers' BertTokenizerFast from the same vocab.txt."""
    return transformers.BertTokenizerFast.from_pretrained(folder / "vocab")


def roberta_encoder(folder: Path, max_len: int = 64) -> Path:
    """A random RoBERTa saved by transformers, with a byte-level BPE learnt from ``WORDS`` and
    RoBERTa's pair format (its tokenizer.json written by RobertaTokenizerFast)."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 5, vocab_size=600,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    (folder / "bpe").mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder / "bpe"))
    tok = transformers.RobertaTokenizerFast.from_pretrained(folder / "bpe")
    config = transformers.RobertaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=max_len + 2, type_vocab_size=1)
    torch.manual_seed(0)
    transformers.RobertaModel(config).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    return folder / "model"


def roberta_reference(folder: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.RobertaTokenizerFast.from_pretrained(folder / "model")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
