"""Run a function on several processes joined by gloo on 127.0.0.1 (a free port), bounded in
time, for the tests of training beyond one device. Each rank's return value comes back as
JSON through a file; a rank that fails sends its traceback, which the test shows."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import traceback
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank: int, world: int, port: int, out: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    path = Path(out) / f"rank{rank}.json"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        path.write_text(json.dumps({"ok": result}))
    except BaseException:
        path.write_text(json.dumps({"error": traceback.format_exc()}))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world: int, tmp: Path, *args, timeout: float = 90) -> list:
    """``fn(rank, world, *args)`` on ``world`` spawned processes; their results, by rank."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, str(tmp), args))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    results = []
    for r in range(world):
        path = tmp / f"rank{r}.json"
        got = json.loads(path.read_text()) if path.exists() else {"error": "no result (timeout "
                                                                             "or crash)"}
        assert "error" not in got, f"rank {r}:\n{got['error']}"
        results.append(got["ok"])
    return results
