"""Training beyond one device, measured on this CPU with torch's own tools, each figure beside
the course's formula (docs/scaling.md).

1. Activation checkpointing (``attnlab.training.parallel.apply_checkpointing``, modes none,
   block and sqrt) on a 12-layer GPT, one process, fp32: the peak memory of one training step
   (forward + backward) from ``torch.distributed._tools.MemTracker`` (a dispatch mode that
   follows every tensor storage, so it works on the CPU), the activations at that peak (peak
   minus the parameters and gradients held then), and the median step time of interleaved
   steps after a warm-up. Course: activations ÷ √N for sqrt, time × (1 + α), α ≈ 0.2–0.3.
2. DDP vs FSDP on 2 gloo ranks (spawned, 1 thread each): parameters, gradients and AdamW state
   per rank after one step, from ``MemTracker`` (one process, DDP) and
   ``FSDPMemTracker`` (FSDP2 through ``parallel.apply_fsdp``), beside
   ``attnlab.placement.parallel_memory`` (M per rank for DDP, M/N for FSDP).
3. Pipeline bubble: 2 stages (``attnlab.training.stages.Pipeline``, GPipe) on 2 gloo ranks,
   1 thread each, B = 1, 2, 4, 8 micro-batches: the step time T_pp(B) (forward + backward, the
   slower rank's, median), against T_1, one process with 1 thread running the whole model on
   the same batch. Measured efficiency T_1 / (N·T_pp) beside the course's B / (B + N − 1).

    .venv/bin/python -m benchmarks.parallel [--quick] [--steps 5]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from attnlab import hardware
from attnlab.build import build_model, skeleton
from attnlab.config import ModelConfig
from attnlab.data.stream import LMBatch
from attnlab.placement import parallel_memory
from attnlab.training import parallel
from attnlab.training.objectives import CausalLM
from attnlab.training.stages import Pipeline

FULL = dict(model=dict(n_decoder_layers=12, d_model=256, n_heads=4, d_ff=1024),
            ckpt_batch=(8, 256), mem_batch=(4, 128), pipe_batch=(8, 128), micro=(1, 2, 4, 8))
QUICK = dict(model=dict(n_decoder_layers=4, d_model=64, n_heads=4, d_ff=256),
             ckpt_batch=(2, 32), mem_batch=(2, 16), pipe_batch=(4, 16), micro=(1, 2, 4))


def _config(knobs: dict) -> ModelConfig:
    return ModelConfig.from_preset("gpt-mini", **knobs)


def _batch(config: ModelConfig, rows: int, length: int) -> LMBatch:
    ids = torch.randint(0, config.vocab_size, (rows, length + 1),
                        generator=torch.Generator().manual_seed(1))
    return LMBatch(ids[:, :-1], ids[:, 1:])


def _model(config: ModelConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config)


def _step(model, batch: LMBatch) -> float:
    """One forward + backward of the mean next-token loss; returns the forward's seconds."""
    start = time.perf_counter()
    loss = CausalLM().loss(model, batch).loss / batch.targets.numel()
    forward = time.perf_counter() - start
    loss.backward()
    return forward


def _snapshot(tracker, kind: str) -> dict[str, int]:
    """A tracker's snapshot on the CPU, by category name (the enum's value)."""
    snap = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    return {getattr(k, "value", k): v for k, v in snap.items()}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"  # MiB


# --- 1. activation checkpointing ---------------------------------------------------------------
def checkpointing(sizes: dict, steps: int) -> None:
    from torch.distributed._tools.mem_tracker import MemTracker

    config = _config(sizes["model"])
    rows, length = sizes["ckpt_batch"]
    n = config.n_decoder_layers
    batch = _batch(config, rows, length)
    models, peaks = {}, {}
    for mode in parallel.MODES:
        models[mode] = model = _model(config)
        parallel.apply_checkpointing(model, mode)
        tracker = MemTracker()
        tracker.track_external(model)
        with warnings.catch_warnings():  # sqrt's segments call layers inside a layer's call
            warnings.filterwarnings("ignore", "The module hierarchy tracking")
            with tracker:
                _step(model, batch)
        peaks[mode] = _snapshot(tracker, "peak")
    times: dict[str, list[float]] = {mode: [] for mode in models}
    forward = []  # the forward's share of a step without checkpointing: the recomputed part
    for i in range(steps + 1):  # the modes alternate step by step: noise hits all alike
        for mode, model in models.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fwd = _step(model, batch)
            if i:  # the first round is the warm-up
                times[mode].append(time.perf_counter() - start)
                if mode == "none":
                    forward.append(fwd / times[mode][-1])
    act = {m: p["Total"] - p["Parameter"] - p["Gradient"] for m, p in peaks.items()}
    med = {m: statistics.median(t) for m, t in times.items()}
    seg = math.ceil(math.sqrt(n))
    layer_in = rows * length * config.d_model * 4  # one layer's input, fp32 bytes
    inside = act["none"] / n  # one layer's activations, from the run without checkpointing
    model_of = {"none": act["none"], "block": n * layer_in + inside,
                "sqrt": math.ceil(n / seg) * layer_in + seg * inside}
    course = {"none": "1", "block": "÷ a constant", "sqrt": f"1/√{n} = {1 / math.sqrt(n):.2f}"}
    print(f"### 1. Activation checkpointing: gpt-mini, {n} layers, d_model {config.d_model}, "
          f"d_ff {config.d_ff}, batch {rows} × {length} tokens, fp32, one process, "
          f"{torch.get_num_threads()} threads\n")
    print("| mode | peak (MiB) | params + grads at the peak | activations (MiB) | vs none | "
          "course | kept inputs + one segment's inside (MiB) | step (s) | time vs none | "
          "course 1 + α |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in models:
        p = peaks[m]
        print(f"| {m} | {_mib(p['Total'])} | {_mib(p['Parameter'] + p['Gradient'])} | "
              f"{_mib(act[m])} | {act[m] / act['none']:.2f} | {course[m]} | "
              f"{_mib(model_of[m])} | {med[m]:.2f} | {med[m] / med['none']:.2f} | "
              f"{'1' if m == 'none' else '1.2–1.3'} |")
    print(f"\nPeak: MemTracker's peak total over the step; activations = peak − parameters − "
          f"gradients in that snapshot (activations and backward temporaries). Segments of "
          f"⌈√{n}⌉ = {seg} layers. Last column: N or N/{seg} layer inputs "
          f"({_mib(layer_in)} MiB each) + 1 or {seg} layers' inside (none's activations / {n}"
          f" = {_mib(inside)} MiB). Times: median of {steps} steps. Here the forward (with "
          f"the loss) is {statistics.median(forward):.0%} of a step without checkpointing: "
          f"recomputing it once predicts 1 + α = {1 + statistics.median(forward):.2f}.\n")


# --- spawned gloo ranks ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(fn, rank: int, world: int, port: int, out, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        out.put((rank, fn(rank, world, *args), None))
    except BaseException:
        out.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(fn, world: int, *args, timeout: float = 300) -> list:
    """``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; their results by rank."""
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, out, args))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        for _ in range(world):
            rank, value, error = out.get(timeout=timeout)
            if error:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            results[rank] = value
    except queue.Empty:
        raise RuntimeError(f"no result from the ranks in {timeout:.0f} s") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


# --- 2. DDP vs FSDP ----------------------------------------------------------------------------
def _memory(rank: int, world: int, knobs: dict, rows: int, length: int, strategy: str) -> dict:
    """Bytes by category after one AdamW step (``current``) and the step's peak, this rank,
    on its ``rows / world`` rows of the batch."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from attnlab.training import distributed

    config = _config(knobs)
    batch = _batch(config, rows, length)
    batch = LMBatch(*(t.chunk(world)[rank] for t in batch))
    model = _model(config)
    if strategy == "fsdp":
        layout = parallel.RankMesh(parallel.ParallelPlan(world=world, strategy="fsdp"),
                                 torch.device("cpu"))
        parallel.apply_fsdp(model, layout, "fp32")
    elif world > 1:
        model = distributed.wrap(model)  # attnlab's DDP, as the trainer wraps it
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if strategy == "fsdp":
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((batch.inputs,))
    else:
        tracker = MemTracker()
        tracker.track_external(model, opt)
    with tracker:
        _step(model, batch)
        opt.step()
    return {"current": _snapshot(tracker, "current"), "peak": _snapshot(tracker, "peak")}


def data_parallel(sizes: dict) -> None:
    config = _config(sizes["model"])
    rows, length = sizes["mem_batch"]
    world = 2
    meta = skeleton(config)  # shapes only, for the course's counts
    one = _memory(0, 1, sizes["model"], rows, length, "ddp")
    ddp = _spawn(_memory, world, sizes["model"], rows, length, "ddp")
    fsdp = _spawn(_memory, world, sizes["model"], rows, length, "fsdp")
    m = sum(p.numel() for p in meta.parameters())
    print(f"### 2. DDP vs FSDP on {world} gloo ranks: gpt-mini, {config.n_decoder_layers} layers,"
          f" d_model {config.d_model}, M = {m:,} parameters, AdamW, fp32, batch {rows} × "
          f"{length} split over the ranks\n")
    print("| layout | rank | parameters (MiB) | course | gradients (MiB) | course | "
          "AdamW state (MiB) | course | the three | course 16·M/rank | other held (MiB) | "
          "peak during the step (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows_out = [("one process", "ddp", 1, [one], ("Parameter", "Gradient", "Optstate")),
                (f"DDP {world}", "ddp", world, ddp, ("Parameter", "Gradient", "Optstate")),
                (f"FSDP {world}", "fsdp", world, fsdp, ("Sharded Param", "Sharded Grad",
                                                         "OptState"))]
    for name, strategy, n, ranks, keys in rows_out:
        f = parallel_memory(meta, n, strategy=strategy, config=config)
        course = (f.parameters, f.gradients, f.optimizer)
        for r, got in enumerate(ranks):
            cur = got["current"]
            cells = " | ".join(f"{_mib(cur.get(k, 0))} | {_mib(c)}"
                               for k, c in zip(keys, course, strict=True))
            total = sum(cur.get(k, 0) for k in keys)
            print(f"| {name} | {r} | {cells} | {_mib(total)} | {_mib(f.total)} | "
                  f"{_mib(cur['Total'] - total)} | {_mib(got['peak']['Total'])} |")
    print("\nMeasured: MemTracker (one process, DDP) and FSDPMemTracker (FSDP: its sharded "
          "parameters, sharded gradients and optimizer state) after one AdamW step; course: "
          "attnlab.placement.parallel_memory (4 + 4 + 8 bytes per parameter held). The peak adds "
          "the step's activations and temporaries, and, for FSDP, the all-gathered layers. "
          "Other held: what else stays allocated after the step. Under DDP it is the "
          "reducer's flat gradient buckets: attnlab wraps DDP with gradient_as_bucket_view=True, "
          "so the gradients are views into those buckets, which the tracker counts there and "
          "not as gradients; parameters + buckets + AdamW state = 16·M, one copy of the "
          "gradients (DDP's default keeps a second: 20·M).\n")


# --- 3. pipeline bubble ------------------------------------------------------------------------
def _pipeline(rank: int, world: int, knobs: dict, rows: int, length: int, micro: tuple,
              steps: int) -> dict:
    """Median step time of a ``world``-stage GPipe pipeline for each number of micro-batches:
    per step, the slower rank's forward + backward, both ranks starting together."""
    config = _config(knobs)
    batch = _batch(config, rows, length)
    out = {}
    for b in micro:
        pipe = Pipeline(_model(config), CausalLM(), rank, world, None, b, "gpipe")
        times = []
        for _ in range(steps + 1):
            pipe.module.zero_grad(set_to_none=True)
            dist.barrier()
            start = time.perf_counter()
            pipe.step(batch, 1.0 / batch.targets.numel())
            times.append(time.perf_counter() - start)
        slowest = torch.tensor(times[1:], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[b] = statistics.median(slowest.tolist())
    return out


def _one_process(config: ModelConfig, batch: LMBatch, b: int, steps: int) -> float:
    """Median forward + backward time of the whole model in this process, ``b`` micro-batches
    accumulated (the pipeline's own one-stage path)."""
    pipe = Pipeline(_model(config), CausalLM(), 0, 1, None, b, "gpipe")
    times = []
    for _ in range(steps + 1):
        pipe.module.zero_grad(set_to_none=True)
        start = time.perf_counter()
        pipe.step(batch, 1.0 / batch.targets.numel())
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def pipeline(sizes: dict, steps: int) -> None:
    config = _config(sizes["model"])
    rows, length = sizes["pipe_batch"]
    micro, n = sizes["micro"], 2
    batch = _batch(config, rows, length)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # T_1: one process with one thread, as each rank has
    alone = {b: _one_process(config, batch, b, steps) for b in (1, *micro)}
    torch.set_num_threads(threads)
    t_pp = _spawn(_pipeline, n, sizes["model"], rows, length, micro, steps)[0]
    t1 = alone[1]
    print(f"### 3. Pipeline bubble: GPipe, N = {n} stages of {config.n_decoder_layers // n} "
          f"layers on {n} gloo ranks (1 thread each), gpt-mini d_model {config.d_model}, batch "
          f"{rows} × {length} tokens, fp32\n")
    print(f"T_1 = {t1:.3f} s: one process, 1 thread, the whole model, forward + backward of "
          f"the whole batch; ideal T_pp = T_1 / {n} = {t1 / n:.3f} s.\n")
    print("| B | rows per micro-batch | T_pp (s) | efficiency T_1 / (N·T_pp) | course B/(B+N−1) "
          "| T_1 with B micro-batches (s) | efficiency against it |")
    print("|---|---|---|---|---|---|---|")
    for b in micro:
        print(f"| {b} | {rows // b} | {t_pp[b]:.3f} | {t1 / (n * t_pp[b]):.1%} | "
              f"{b}/{b + n - 1} = {b / (b + n - 1):.1%} | {alone[b]:.3f} | "
              f"{alone[b] / (n * t_pp[b]):.1%} |")
    print(f"\nMedians of {steps} steps after a warm-up. The hidden states and their gradients "
          "cross between the stages over gloo (TCP on 127.0.0.1): that communication adds to "
          "the bubble. The last column compares with one process running the same B "
          "micro-batches, which takes out what smaller matrices cost, leaving the bubble and "
          "the communication.\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny model, for a smoke run")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps of part 1, twice as many in part 3 (default 5; quick 1)")
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    steps = args.steps or (1 if args.quick else 5)
    print(hardware.report(), flush=True)
    start = time.perf_counter()
    checkpointing(sizes, steps)
    data_parallel(sizes)
    pipeline(sizes, 2 * steps)  # its steps are short: more of them
    print(f"(whole run: {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
