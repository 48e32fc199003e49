"""Sharded training checkpoints with ``torch.distributed.checkpoint`` (DCP), read without
unpickling arbitrary objects.

A sharded run's checkpoint ``step-N/`` is the usual model folder (full weights in
safetensors, gathered to rank 0: what ``attnlab.load``, ``average`` and every inference
command read, in one process) plus ``sharded/``: DCP's files, each rank's part of the model
and of the optimizer state, which only ``--resume`` reads. DCP reshards on load, so a run
saved by N ranks resumes on M.

Atomicity: every rank writes its part into one temporary folder (:func:`write_shards`); after
a barrier, rank 0 moves it into the checkpoint's own temporary folder and renames that into
place (:func:`attnlab.training.checkpoint.save_checkpoint`, the one checkpoint writer, through
:func:`attnlab.storage.save_model_dir`), so ``step-N/`` appears whole or not at all.

DCP writes its metadata with ``pickle`` and the optimizer's non-tensor values with
``torch.save``. A checkpoint folder is a file from a user: the metadata is read by an
unpickler that knows only DCP's own record types, and the values with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
import shutil
import warnings
from pathlib import Path

import torch

from attnlab.build import build_model
from attnlab.errors import BadInput, WriteFailed
from attnlab.storage import CheckpointError
from attnlab.training import distributed
from attnlab.training.parallel import fused_state

SHARDED = "sharded"

# The classes and functions DCP's metadata names (checked on torch 2.13): records, sizes,
# dtypes and the two enum decoders. Nothing here runs code chosen by the file.
_METADATA_NAMES = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
      ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
      ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_NAMES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP checkpoint")


def _reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata_path = Path(self.path) / ".metadata"
            try:
                with open(metadata_path, "rb") as f:
                    metadata = _MetadataUnpickler(f).load()
            except FileNotFoundError:
                raise CheckpointError(f"{metadata_path}: missing") from None
            except Exception as e:
                raise CheckpointError(f"{metadata_path}: not a checkpoint's metadata ({e})") \
                    from None
            for info in (getattr(metadata, "storage_data", None) or {}).values():
                name = str(getattr(info, "relative_path", ""))
                if not name or Path(name).name != name or name in (".", ".."):
                    raise CheckpointError(f"{metadata_path}: names a file outside its folder "
                                          f"({name!r})")
            if getattr(metadata, "storage_meta", None) is None:
                from torch.distributed.checkpoint.metadata import StorageMeta
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def _planner():
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._nested_dict import set_element
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                            loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafePlanner()


def save_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 ) -> None:
    """Every rank writes its shards of the model and optimizer state into ``folder``
    (a collective call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))


def load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 ) -> None:
    """Load ``folder`` (written by :func:`save_sharded` on any number of ranks) into this
    rank's model and optimizer, resharded to the current layout (a collective call), or into
    the one plain model of a process started without torchrun."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    reader = _reader(folder)
    reader.read_metadata()  # a damaged or hostile file fails here, in one line
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    try:
        with warnings.catch_warnings():  # one plain process is meant, not a slip
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=_planner())
    except CheckpointError:
        raise
    except Exception as e:  # a missing key, a wrong shape: another model's checkpoint
        raise CheckpointError(f"{folder}: does not match this run's model ({e})") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def write_shards(root: Path, step: int, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> Path:
    """Every rank's shards of ``model`` and ``optimizer`` for step ``step``'s checkpoint,
    written into one temporary folder under ``root`` (a collective call; every rank returns
    once all are on disk). :func:`attnlab.training.checkpoint.save_checkpoint` then moves the
    folder into the checkpoint as ``sharded/``."""
    tmp = root / f".tmp-{SHARDED}-{step:08d}"

    def fresh_folder() -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            raise WriteFailed(f"{root}: could not be written ({e.strerror or e})") from None

    distributed.from_main(fresh_folder)  # every rank waits for it, or stops with it
    save_sharded(tmp, model, optimizer)
    distributed.barrier()  # every rank's part is on disk
    return tmp


def resumable(folder: Path, state: dict, sharded: bool, layout: dict) -> bool:
    """Whether checkpoint ``folder`` (its trainer ``state``) resumes from its shards: True for
    a sharded checkpoint, whatever the run (DCP loads the shards into an unsharded model as
    into M ranks: the cluster's run goes on in one plain process, or under DDP), False for a
    one-process or DDP checkpoint. Refused, in one line: a one-process or DDP checkpoint for
    a sharded run (its optimizer state is one process's, not named for DCP); another ``pp``
    (a weight tied across stages is named by the stage layout); a fused QKV split by ``--tp``
    in one run and not the other (the shards are named by the layout's projections)."""
    has_shards = (folder / SHARDED).is_dir()
    if sharded and not has_shards:
        raise BadInput(f"{folder} was written by a one-process or DDP run: resume it without "
                       "--parallel fsdp, --tp or --pp")
    if not has_shards:
        return False
    if state.get("pp", 1) != layout["pp"]:
        pp = state.get("pp", 1)
        raise BadInput(f"{folder} was written " + (f"with --pp {pp}: resume it with --pp {pp}"
                                                   if pp > 1 else "without --pp: resume it "
                                                   "without --pp"))
    if bool(state.get("qkv_split")) != layout["qkv_split"]:
        raise BadInput(f"{folder} was saved " + (
            "with --tp (its fused QKV matrices split by heads): resume with --tp >= 2"
            if state.get("qkv_split") else "without --tp: resume without it"))
    return True


def plain_model(full: dict[str, torch.Tensor], config, qkv_split: bool = False
                ) -> torch.nn.Module:
    """A plain model (on the CPU: one device may not hold it) of the gathered weights
    ``full``; ``qkv_split``: tensor parallelism had split its fused QKV matrices, which are
    put back together (:func:`attnlab.training.parallel.fused_state`)."""
    with torch.random.fork_rng(devices=[]):  # its random init must not move this rank's RNG
        model = build_model(config)
    model.load_state_dict(fused_state(full, config) if qkv_split else full)
    return model


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors on rank 0 (empty on the others),
    gathered by torch (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``);
    a collective call."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


__all__ = ["SHARDED", "resumable", "plain_model", "write_shards", "save_sharded",
           "load_sharded", "full_model_state"]
