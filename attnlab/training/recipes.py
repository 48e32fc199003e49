"""Training recipes: one path for every family, each family supplying only what differs.

    read and validate data -> config -> model -> trainer -> checkpoints -> results

:func:`run` is that path. A :class:`Recipe` prepares the data (tokenizers, batch streams, the
task that turns a batch into a loss) and completes the model config from it; it may build the
model its own way (a classifier starts from a pretrained encoder) and add results at the end
(the classifier's test accuracy). Nothing here mutates the caller's config.

* :class:`TranslationRecipe`: an encoder–decoder, the paper's recipe (``train translate``);
* :class:`LMRecipe`: a decoder-only language model on a text file (``train lm``);
* :class:`MLMRecipe`: BERT masked-LM (and NSP) pretraining (``train mlm``);
* fine-tuning a pretrained encoder, with their tasks (:mod:`attnlab.tasks`): classify, ner
  and qa; :func:`finish_classifier` ends every classifier's run;
* :class:`~attnlab.training.image.ImageRecipe`: a ViT on images (``train image``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab import build, hardware
from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.data import (
    Corpus,
    LMBatches,
    TranslationBatches,
    eval_windows,
    filter_by_length,
)
from attnlab.errors import BadInput
from attnlab.files import read_text
from attnlab.interop import peft
from attnlab.storage import BEST, CHECKPOINTS, FINAL, list_checkpoints, load_weights, save_model_dir
from attnlab.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    WordTokenizer,
)
from attnlab.training import distributed
from attnlab.training.guard import RunLock
from attnlab.training.objectives import CausalLM, MaskedLM, Seq2Seq, classification_metrics
from attnlab.training.trainer import TrainConfig, Trainer

TOKENIZERS = {"char": CharTokenizer, "word": WordTokenizer}


@dataclass
class Prepared:
    """What a recipe makes of its data before a model exists."""

    config: ModelConfig  # the model config, completed from the data (vocabulary, ids, ...)
    tokenizers: dict[str, Tokenizer]
    batches: Any  # the endless training stream
    task: Any  # an objective of attnlab.training.objectives (Seq2Seq, CausalLM, ...)
    summary: str  # one line about the data, printed before training
    val_batches: list | None = None
    state: dict[str, Any] = field(default_factory=dict)  # what finish() needs later


@dataclass
class TrainedRun:
    model: nn.Module
    tokenizers: dict[str, Tokenizer]
    history: list[dict[str, float]]
    results: dict[str, float]
    budget_note: str | None = None  # with a time budget: the plan it made, in one line


class Recipe:
    """A family's part of :func:`run`; ``arch`` is the architecture it trains."""

    arch = ""

    def prepare(self, model_config: ModelConfig, train_config: TrainConfig) -> Prepared:
        raise NotImplementedError

    def build(self, prepared: Prepared) -> nn.Module:
        return build_model(prepared.config)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        """The run's end, given the model it ends with (the one early stopping kept, when it
        kept one). By default that kept model becomes ``final/``, so the run folder means it
        (otherwise the run folder means its newest checkpoint); no results."""
        if (out_dir / BEST).exists():
            write_final(model, prepared, out_dir, rank)
        return {}


def run(recipe: Recipe, out_dir: str | Path, model_config: ModelConfig,
        train_config: TrainConfig, resume: bool = False, log=print) -> TrainedRun:
    """Train with ``recipe``; checkpoints, metrics.jsonl and results go to ``out_dir``, which
    this process holds (:class:`~attnlab.training.guard.RunLock`) until it returns."""
    out_dir = Path(out_dir)
    if model_config is not None:  # a split the model cannot take: before any process waits
        train_config.plan().check(model_config)
    rank, _ = distributed.init_from_env(always=train_config.parallel_asked)
    with RunLock(out_dir) if rank == 0 else contextlib.nullcontext():
        return _run(recipe, out_dir, rank, model_config, train_config, resume, log)


def _run(recipe: Recipe, out_dir: Path, rank: int, model_config: ModelConfig,
         train_config: TrainConfig, resume: bool, log) -> TrainedRun:
    if not resume and list_checkpoints(out_dir / CHECKPOINTS):  # never mix two runs
        raise BadInput(f"{out_dir} already holds checkpoints: pass --resume to continue that "
                       "run, or choose another --out")
    prepared = recipe.prepare(model_config, train_config)
    if prepared.config.arch != recipe.arch:
        raise BadInput(f"{type(recipe).__name__} trains arch={recipe.arch!r}, not "
                       f"arch={prepared.config.arch!r}")
    if rank == 0:
        log(f"data: {prepared.summary}")
    torch.manual_seed(train_config.seed)  # the same initial weights for the same seed
    model = recipe.build(prepared).to(hardware.pick_device(train_config.device))
    if train_config.adapter:  # LoRA or bottleneck adapters over the frozen model
        request = {k: v for k, v in train_config.adapter.items() if k != "base"}
        model = peft.adapt(model, peft.adapter_spec(model, **request))
        if rank == 0:
            log(f"adapters: {_adapter_summary(model)}")
    tokenizers = {role: tok.to_dict() for role, tok in prepared.tokenizers.items()}
    trainer = Trainer(model, prepared.batches, train_config, out_dir, tokenizers,
                      model.config, prepared.task, prepared.val_batches, log)
    if resume and trainer.resume() and rank == 0:
        log(f"resumed from step {trainer.step}")
    history = trainer.fit()
    prepared.state["step"] = trainer.step  # what final/ records it was made at
    model = trainer.full_model()  # whole again, on every rank, if the plan had split it
    if (out_dir / BEST).exists():  # early stopping kept a model: the run ends with that one
        load_weights(model, out_dir / BEST)
    results = recipe.finish(model, prepared, out_dir, rank)
    if model.config.adapter and rank == 0:  # the adapter alone, as peft writes it
        peft.save_adapter(model, out_dir / "adapter", str(train_config.adapter.get("base", "")))
    return TrainedRun(model.eval(), prepared.tokenizers, history, results, trainer.budget_note)


def _adapter_summary(model: nn.Module) -> str:
    """``LoRA r=8 on 12 layers: 73,728 of 22,786,560 parameters train (0.32%)``."""
    spec = model.config.adapter
    what = (f"LoRA r={spec['r']} alpha={spec['alpha']:g}" if spec["method"] == "lora"
            else f"bottleneck adapters of {spec['size']}")
    # a 4-bit layer's codes are buffers: counted as the in·out weights they stand for
    total = sum(p.numel() for p in model.parameters()) + sum(
        m.in_features * m.out_features for m in model.modules() if hasattr(m, "codes"))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    extra = f" and {', '.join(spec['trainable'])} in full" if spec.get("trainable") else ""
    return (f"{what} on {len(spec['modules'])} layers{extra}: {trained:,} of {total:,} "
            f"parameters train ({trained / total:.2%})")


# --- the families --------------------------------------------------------------------------
@dataclass
class TranslationRecipe(Recipe):
    """Source ``... eos``, target ``bos ... eos``. ``shared`` (e.g. a BPE tokenizer trained on
    both sides) gives the paper's setup: one vocabulary and one embedding matrix for source,
    target and output; otherwise each side learns its own word or character vocabulary from
    the training pairs. The corpus's held-out pairs (if any) give the validation loss."""

    arch = "encoder-decoder"
    corpus: Corpus
    src_tokenizer: str = "word"
    tgt_tokenizer: str = "char"
    shared: Tokenizer | None = None

    def prepare(self, model_config: ModelConfig, train_config: TrainConfig) -> Prepared:
        if self.shared is not None:
            src_tok = tgt_tok = self.shared
            config = dataclasses.replace(model_config, vocab_size=src_tok.vocab_size,
                                         tgt_vocab_size=None)
        else:
            src_tok = TOKENIZERS[self.src_tokenizer].train(s for s, _ in self.corpus.train)
            tgt_tok = TOKENIZERS[self.tgt_tokenizer].train(t for _, t in self.corpus.train)
            config = dataclasses.replace(model_config, vocab_size=src_tok.vocab_size,
                                         tgt_vocab_size=tgt_tok.vocab_size)
        src, tgt, report = _encode_pairs(self.corpus.train, src_tok, tgt_tok, config.max_len)
        if not src:
            raise BadInput(f"empty corpus after length filtering: {report}")
        seq = max(max(map(len, src)), max(map(len, tgt)))  # the longest padded sequence
        build.check_training_memory(config, max(1, train_config.max_tokens // seq), seq,
                                    f"--max-tokens {train_config.max_tokens}",
                                    train_config.device_for_memory)
        val_src, val_tgt, val_report = _encode_pairs(self.corpus.test, src_tok, tgt_tok,
                                                     config.max_len)
        held_out = self.corpus.held_out
        if val_report.kept < len(self.corpus.test):
            held_out += f" ({val_report.kept} of them within {config.max_len} tokens)"
        return Prepared(config, {"source": src_tok, "target": tgt_tok},
                        TranslationBatches(src, tgt, train_config.max_tokens,
                                           seed=train_config.seed, pad_id=config.pad_id),
                        Seq2Seq(config.pad_id, train_config.label_smoothing),
                        f"{report}; {held_out}; vocabularies {src_tok.vocab_size} (source) "
                        f"and {tgt_tok.vocab_size} (target)",
                        val_batches=TranslationBatches(
                            val_src, val_tgt, train_config.max_tokens,
                            pad_id=config.pad_id).one_pass() or None)


def special_ids(tok: Tokenizer, config: ModelConfig) -> dict[str, int]:
    """The model's special ids from its tokenizer's; one the tokenizer lacks keeps the
    config's, moved inside the vocabulary (its last id) when it lies past it."""
    ids = {}
    for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
        mine = getattr(tok, name)
        ids[name] = mine if mine is not None else min(getattr(config, name), tok.vocab_size - 1)
    return ids


def _encode_pairs(pairs: list[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer,
                  max_len: int):
    """Source ``... eos`` and target ``bos ... eos`` ids of the pairs within ``max_len``
    tokens: ``(src, tgt, report)`` as :func:`~attnlab.data.filter_by_length` returns them."""
    return filter_by_length([src_tok.encode(s, add_eos=True) for s, _ in pairs],
                            [tgt_tok.encode(t, add_bos=True, add_eos=True) for _, t in pairs],
                            max_len)


@dataclass
class LMRecipe(Recipe):
    """A text file: the first ``1 - val_fraction`` trains, the rest validates."""

    arch = "decoder"
    text: str | Path
    block: int
    batch_size: int
    tokenizer: str = "char"  # or "gpt2" with bpe_dir holding encoder.json and vocab.bpe
    bpe_dir: str | Path | None = None
    val_fraction: float = 0.1
    given: Tokenizer | None = None  # a model's own tokenizer (a teacher's), instead of a new one
    # fine-tuning a pretrained language model (a run, an HF folder, a .gguf file, smollm2):
    # its config and tokenizer; int4: its weight matrices frozen as 4-bit codes (QLoRA)
    init: str | None = None
    int4: bool = False

    def prepare(self, model_config: ModelConfig, train_config: TrainConfig) -> Prepared:
        text = read_text(self.text, "text file", allow_empty=False)
        base = None
        if self.init is not None:
            from attnlab.storage import load

            base = load(self.init).expect("decoder", "train lm --init")
            self.given = base.tokenizer
            if self.block > base.config.context:
                raise BadInput(f"--block {self.block}: {self.init} sees at most "
                               f"{base.config.context} tokens")
            model_config = base.config
        elif self.int4:
            raise BadInput("--int4 quantises a pretrained model's weights: give --init")
        if self.given is not None:
            tok = self.given
        elif self.tokenizer == "char":
            tok: Tokenizer = CharTokenizer.train([text])
        elif self.tokenizer == "gpt2":
            if not self.bpe_dir:
                raise BadInput("--tokenizer gpt2 needs --bpe-dir holding encoder.json and "
                               "vocab.bpe")
            folder = Path(self.bpe_dir)
            tok = BPETokenizer.from_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")
        else:
            raise BadInput(f"unknown tokenizer {self.tokenizer!r} (char or gpt2)")
        kind = (self.tokenizer if self.given is None
                else type(tok).__name__.removesuffix("Tokenizer").lower())
        ids = torch.tensor(tok.encode(text), dtype=torch.long)
        split = int(len(ids) * (1 - self.val_fraction))
        train_ids, val_ids = ids[:split], ids[split:]
        if self.block + 1 >= len(train_ids):
            raise BadInput(f"--block {self.block}: the training text has only "
                           f"{len(train_ids):,} tokens (windows need block + 1)")
        batches = LMBatches(train_ids, self.block, self.batch_size, train_config.seed)
        if base is not None:  # a pretrained model keeps its config (and its context)
            config = base.config
        else:
            config = dataclasses.replace(model_config, vocab_size=tok.vocab_size,
                                         max_len=max(model_config.max_len, self.block),
                                         block_size=self.block,  # generation keeps within it
                                         **special_ids(tok, model_config))
        build.check_training_memory(config, self.batch_size, self.block,
                                    f"--block {self.block} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        return Prepared(config, {"text": tok},
                        batches,
                        CausalLM(train_config.label_smoothing),
                        f"{len(train_ids):,} training and {len(val_ids):,} validation tokens "
                        f"({kind} tokenizer, vocabulary {tok.vocab_size})",
                        val_batches=eval_windows(val_ids, self.block, self.batch_size),
                        state={"base": None if base is None else base.model})

    def build(self, prepared: Prepared) -> nn.Module:
        """A new model of the config, or the ``init`` model (its matrices quantised to 4
        bits with ``int4``: the frozen base of a QLoRA run)."""
        base = prepared.state.pop("base", None)
        if base is None:
            return build_model(prepared.config)
        if self.int4:
            from attnlab.compression.quantize import quantize_model

            quantize_model(base, bits=4)
        return base.train()


@dataclass
class MLMRecipe(Recipe):
    """Each non-empty line is a sentence and consecutive lines are consecutive text; the last
    ``val_fraction`` of lines validate. ``tokenizer``: a ``vocab.txt`` / ``tokenizer.json`` /
    model folder; by default a WordPiece vocabulary of ``vocab_size`` is learned."""

    arch = "encoder"
    text: str | Path
    max_len: int = 128
    batch_size: int = 32
    tokenizer: str | Path | None = None
    vocab_size: int = 8000
    nsp: bool = False
    val_fraction: float = 0.05

    def prepare(self, model_config: ModelConfig, train_config: TrainConfig) -> Prepared:
        from attnlab.data.mlm import MLMBatches

        text = read_text(self.text, "text file", allow_empty=False)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if len(lines) < 20:
            raise BadInput(f"{self.text}: {len(lines)} non-empty lines; masked-LM needs at "
                           "least 20")
        tok = (WordPieceTokenizer.from_file(self.tokenizer) if self.tokenizer
               else WordPieceTokenizer.train([str(self.text)], vocab_size=self.vocab_size))
        sentences = [tok.encode(line) for line in lines]
        split = min(int(len(sentences) * (1 - self.val_fraction)), len(sentences) - 2)
        config = dataclasses.replace(
            model_config, vocab_size=tok.vocab_size, head="pretraining" if self.nsp else "mlm",
            max_len=max(model_config.max_len, self.max_len), pad_id=tok.pad_id,
            unk_id=tok.unk_id, bos_id=tok.cls_id, eos_id=tok.sep_id)
        build.check_training_memory(config, self.batch_size, self.max_len,
                                    f"--max-len {self.max_len} --batch {self.batch_size}",
                                    train_config.device_for_memory)
        val = MLMBatches(sentences[split:], tok, self.max_len, self.batch_size, seed=10_007,
                         nsp=self.nsp)
        n_val = max(1, min(20, (len(lines) - split) // 4))
        return Prepared(config, {"text": tok},
                        MLMBatches(sentences[:split], tok, self.max_len, self.batch_size,
                                   train_config.seed, self.nsp),
                        MaskedLM(),
                        f"{split:,} training and {len(lines) - split:,} validation lines "
                        f"(WordPiece vocabulary {tok.vocab_size})",
                        val_batches=[val.batch(i) for i in range(n_val)])


def write_final(model: nn.Module, prepared: Prepared, out_dir: Path, rank: int) -> None:
    """``model`` as ``out_dir/final`` (rank 0 writes), recorded as made at the run's last step
    (so a run folder means it until training resumes past that step)."""
    if rank == 0:
        save_model_dir(out_dir / FINAL, model, model.config,
                       {k: t.to_dict() for k, t in prepared.tokenizers.items()},
                       step=prepared.state["step"])


def finish_classifier(model: nn.Module, prepared: Prepared, out_dir: Path,
                      rank: int) -> dict[str, float]:
    """A classifier's end of training (text or images): the model the run ends with (the one
    early stopping kept, when it kept one) scored on the validation and test
    (``state["test"]``) batches, and written to ``final/``."""
    device, n = next(model.parameters()).device, model.config.num_labels
    results = {}
    for split, batches in (("val", prepared.val_batches), ("test", prepared.state["test"])):
        results.update({f"{split}_{k}": v for k, v in classification_metrics(
            model, batches, device, n, prepared.task).items()})
    write_final(model, prepared, out_dir, rank)
    return results


# --- the same recipes as plain functions ---------------------------------------------------
def train_translation(corpus: Corpus, out_dir: str | Path, model_config: ModelConfig,
                      train_config: TrainConfig, src_tokenizer: str = "word",
                      tgt_tokenizer: str = "char", resume: bool = False, log=print,
                      shared_tokenizer: Tokenizer | None = None):
    """``(model, {"source", "target"} tokenizers, history)``."""
    done = run(TranslationRecipe(corpus, src_tokenizer, tgt_tokenizer, shared_tokenizer),
               out_dir, model_config, train_config, resume, log)
    return done.model, done.tokenizers, done.history


def train_lm(text_path: str | Path, out_dir: str | Path, model_config: ModelConfig,
             train_config: TrainConfig, block: int, batch_size: int, tokenizer: str = "char",
             bpe_dir: str | None = None, val_fraction: float = 0.1, resume: bool = False,
             log=print):
    """``(model, tokenizer, history)``; history rows carry ``val_loss`` every
    ``train_config.eval_every`` steps and at the last step."""
    done = run(LMRecipe(text_path, block, batch_size, tokenizer, bpe_dir, val_fraction),
               out_dir, model_config, train_config, resume, log)
    return done.model, done.tokenizers["text"], done.history


def train_mlm(text_path: str | Path, out_dir: str | Path, model_config: ModelConfig,
              train_config: TrainConfig, max_len: int = 128, batch_size: int = 32,
              tokenizer: str | None = None, vocab_size: int = 8000, nsp: bool = False,
              val_fraction: float = 0.05, resume: bool = False, log=print):
    """``(model, tokenizer, history)``."""
    done = run(MLMRecipe(text_path, max_len, batch_size, tokenizer, vocab_size, nsp,
                         val_fraction), out_dir, model_config, train_config, resume, log)
    return done.model, done.tokenizers["text"], done.history


__all__ = ["Recipe", "Prepared", "TrainedRun", "run", "TranslationRecipe", "LMRecipe",
           "MLMRecipe", "write_final", "finish_classifier", "train_translation", "train_lm",
           "train_mlm"]
