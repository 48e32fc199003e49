"""Distributed data parallel through ``torchrun`` (gloo on CPU, nccl on CUDA).

Every rank holds the full model and a slice of each global batch; gradients are averaged by
:class:`torch.nn.parallel.DistributedDataParallel`. Single-process runs skip all of it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def launched() -> bool:
    """Whether torchrun (or a launcher like it) started this process: it sets RANK,
    WORLD_SIZE and the rendezvous address."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def init_from_env(always: bool = False) -> tuple[int, int]:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1; with ``always``,
    also for one process: FSDP, TP and PP build their mesh even on one rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (world > 1 or (always and launched())) and not is_distributed():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return rank_and_world()


def rank_and_world() -> tuple[int, int]:
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap(model: nn.Module) -> nn.Module:
    if not is_distributed():
        return model
    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    # gradients as views into DDP's all-reduce buckets: one copy of them, not two (16·M bytes
    # per rank with Adam, as the course counts, instead of 20·M; benchmarks/parallel.py)
    return nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                               gradient_as_bucket_view=True)


def group_device(group=None) -> torch.device:
    """Where ``group``'s collectives take their tensors: this rank's GPU under nccl, else the
    CPU (gloo)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: float | int, group=None) -> float | int:
    """The sum of ``value`` over ``group``'s ranks (default: all of them)."""
    if not is_distributed():
        return value
    t = torch.tensor(float(value), dtype=torch.float64, device=group_device(group))
    dist.all_reduce(t, group=group)
    return type(value)(t.item())


def any_true(flag: bool) -> bool:
    """True on every rank if it is true on any (so all ranks stop together)."""
    return bool(all_reduce_sum(int(flag))) if is_distributed() else flag


def broadcast_from_main(objects: list) -> None:
    """Replace ``objects``' items on every rank by rank 0's, in place (a no-op in one
    process). The objects are pickled between attnlab's own processes, never read from a
    file."""
    if is_distributed():
        dist.broadcast_object_list(objects, src=0)


def from_main(work):
    """Run ``work()`` on rank 0 only, and make its outcome every rank's: an attnlab error
    raised there is raised on every rank (so none waits in a collective for a rank that has
    stopped). Returns ``work()``'s value on rank 0, None elsewhere."""
    from attnlab.errors import AttnlabError

    rank = rank_and_world()[0]
    result, failed = None, [None]
    if rank == 0:
        try:
            result = work()
        except AttnlabError as e:
            failed[0] = (type(e), str(e))
    broadcast_from_main(failed)
    if failed[0] is not None:
        kind, message = failed[0]
        raise kind(message)
    return result


def barrier() -> None:
    """Wait until every rank gets here (a no-op in one process)."""
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    if is_distributed():
        dist.destroy_process_group()
