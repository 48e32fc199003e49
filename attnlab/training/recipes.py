"""End-to-end jobs: train a translator on files or on the built-in numbers task, evaluate it.

Used by ``attnlab train translate`` and ``attnlab demo``; everything here is plain functions
over the library's parts, so the same steps work from Python.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab import hardware
from attnlab.config import ModelConfig
from attnlab.data import TranslationBatches, filter_by_length, numbers_corpus, read_parallel
from attnlab.data.batching import pad
from attnlab.generation import greedy_decode
from attnlab.models import Transformer
from attnlab.tokenizers import CharTokenizer, Tokenizer, WordTokenizer
from attnlab.training import distributed
from attnlab.training.checkpoint import list_checkpoints
from attnlab.training.trainer import TrainConfig, Trainer

TOKENIZERS = {"char": CharTokenizer, "word": WordTokenizer}


@dataclass
class Corpus:
    train: list[tuple[str, str]]
    test: list[tuple[str, str]]


def load_corpus(task: str | None, src: str | None, tgt: str | None, n_train: int = 200_000,
                n_test: int = 500, seed: int = 0) -> Corpus:
    """The numbers task, or parallel files (the last ``n_test`` pairs held out)."""
    if task == "numbers":
        train, test = numbers_corpus(n_train, n_test, seed)
        return Corpus(train, test)
    if task is not None:
        raise ValueError(f"unknown task {task!r}; the built-in task is 'numbers'")
    if not (src and tgt):
        raise ValueError("give --task numbers, or both --src FILE and --tgt FILE")
    pairs = [p for p in read_parallel(src, tgt) if p[0] and p[1]]
    random.Random(seed).shuffle(pairs)
    n_test = min(n_test, len(pairs) // 10)
    return Corpus(pairs[n_test:], pairs[:n_test])


def _refuse_to_overwrite(out_dir: str | Path, resume: bool) -> None:
    """A fresh run must not mix its checkpoints and metrics with an earlier run's."""
    if not resume and list_checkpoints(Path(out_dir) / "checkpoints"):
        raise ValueError(f"{out_dir} already holds checkpoints: pass --resume to continue that "
                         "run, or choose another --out")


def encode_pairs(pairs, src_tok: Tokenizer, tgt_tok: Tokenizer, max_len: int):
    """Source ``... eos``, target ``bos ... eos``; pairs over ``max_len`` are dropped."""
    src = [src_tok.encode(s, add_eos=True) for s, _ in pairs]
    tgt = [tgt_tok.encode(t, add_bos=True, add_eos=True) for _, t in pairs]
    return filter_by_length(src, tgt, max_len)


def train_translation(corpus: Corpus, out_dir: str | Path, model_config: ModelConfig,
                      train_config: TrainConfig, src_tokenizer: str = "word",
                      tgt_tokenizer: str = "char", resume: bool = False, log=print,
                      shared_tokenizer=None):
    """Train and return ``(model, tokenizers, history)``; checkpoints go to ``out_dir``.

    ``shared_tokenizer`` (e.g. a :class:`BPETokenizer` trained on both sides) gives the paper's
    setup: one vocabulary, one embedding matrix for source, target and output; otherwise each
    side gets its own word or character vocabulary, learned from the training pairs.
    """
    rank, _ = distributed.init_from_env()
    _refuse_to_overwrite(out_dir, resume)
    torch.manual_seed(train_config.seed)
    if shared_tokenizer is not None:
        src_tok = tgt_tok = shared_tokenizer
        model_config.vocab_size, model_config.tgt_vocab_size = src_tok.vocab_size, None
    else:
        src_tok = TOKENIZERS[src_tokenizer].train(s for s, _ in corpus.train)
        tgt_tok = TOKENIZERS[tgt_tokenizer].train(t for _, t in corpus.train)
        model_config.vocab_size = src_tok.vocab_size
        model_config.tgt_vocab_size = tgt_tok.vocab_size
    src, tgt, report = encode_pairs(corpus.train, src_tok, tgt_tok, model_config.max_len)
    if not src:
        raise ValueError(f"empty corpus after length filtering: {report}")
    if rank == 0:
        log(f"data: {report}; vocabularies {src_tok.vocab_size} (source) and "
            f"{tgt_tok.vocab_size} (target)")
    model = Transformer(model_config).to(hardware.pick_device(train_config.device))
    batches = TranslationBatches(src, tgt, train_config.max_tokens, seed=train_config.seed)
    tokenizers = {"source": src_tok.to_dict(), "target": tgt_tok.to_dict()}
    trainer = Trainer(model, batches, train_config, out_dir, tokenizers, model_config)
    if resume and trainer.resume() and rank == 0:
        log(f"resumed from step {trainer.step}")
    history = trainer.fit()
    return model.eval(), {"source": src_tok, "target": tgt_tok}, history


@torch.no_grad()
def translate(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer, sentences: list[str],
              batch_size: int = 256, max_len: int | None = None, beam_size: int = 1,
              alpha: float = 0.6) -> list[str]:
    """Translations of ``sentences``: greedy (``beam_size=1``) or beam search with the GNMT
    length penalty α. Sentences are batched by length (less padding), answers keep the input
    order."""
    from attnlab.generation import beam_search

    model.eval()
    ids = [src_tok.encode(s, add_eos=True) for s in sentences]
    longest = max(map(len, ids), default=0)
    if longest > model.config.max_len:
        raise ValueError(f"input of {longest} tokens exceeds the model's maximum length "
                         f"max_len={model.config.max_len}")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad([ids[i] for i in chunk], model.config.pad_id).to(device)
        tokens = (greedy_decode(model, src, max_len=max_len) if beam_size == 1 else
                  beam_search(model, src, beam_size, alpha, max_len=max_len))
        for i, row in zip(chunk, tokens.tolist(), strict=True):
            out[i] = tgt_tok.decode(row)
    return out


def exact_match(model, src_tok, tgt_tok, pairs) -> tuple[float, list[str]]:
    hyps = translate(model, src_tok, tgt_tok, [s for s, _ in pairs])
    correct = sum(h == t for h, (_, t) in zip(hyps, pairs, strict=True))
    return correct / max(1, len(pairs)), hyps


def train_lm(text_path: str | Path, out_dir: str | Path, model_config: ModelConfig,
             train_config: TrainConfig, block: int, batch_size: int, tokenizer: str = "char",
             bpe_dir: str | None = None, val_fraction: float = 0.1, resume: bool = False,
             log=print):
    """Train a decoder-only LM on a text file: the first 90% trains, the last 10% validates.

    Returns ``(model, tokenizer, history)``; ``history`` rows carry ``val_loss`` every
    ``train_config.eval_every`` steps and at the last step.
    """
    from attnlab.data.lm import LMBatches, eval_windows
    from attnlab.models import GPT
    from attnlab.tokenizers.bpe import BPETokenizer

    rank, _ = distributed.init_from_env()
    _refuse_to_overwrite(out_dir, resume)
    path = Path(text_path)
    if not path.exists():
        raise FileNotFoundError(f"text file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not text.strip():
        raise ValueError(f"{path}: the text file is empty")
    if tokenizer == "char":
        tok = CharTokenizer.train([text])
    elif tokenizer == "gpt2":
        if not bpe_dir:
            raise ValueError("--tokenizer gpt2 needs --bpe-dir holding encoder.json and vocab.bpe")
        tok = BPETokenizer.from_gpt2_files(Path(bpe_dir) / "encoder.json",
                                           Path(bpe_dir) / "vocab.bpe")
    else:
        raise ValueError(f"unknown tokenizer {tokenizer!r} (char or gpt2)")
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    split = int(len(ids) * (1 - val_fraction))
    train_ids, val_ids = ids[:split], ids[split:]
    model_config.vocab_size = tok.vocab_size
    model_config.max_len = max(model_config.max_len, block)
    torch.manual_seed(train_config.seed)
    model = GPT(model_config).to(hardware.pick_device(train_config.device))
    if rank == 0:
        log(f"data: {len(train_ids):,} training and {len(val_ids):,} validation tokens "
            f"({tokenizer} tokenizer, vocabulary {tok.vocab_size})")
    trainer = Trainer(model, LMBatches(train_ids, block, batch_size, train_config.seed),
                      train_config, out_dir, {"text": tok.to_dict()}, model_config,
                      val_batches=eval_windows(val_ids, block, batch_size))
    if resume and trainer.resume() and rank == 0:
        log(f"resumed from step {trainer.step}")
    history = trainer.fit()
    return model.eval(), tok, history
