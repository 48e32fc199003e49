"""Fine-tuning attnlab and transformers side by side: the same starting weights, the same
batches in the same order, the same AdamW (weight decay on matrices only), linear warmup and
decay, and gradient clipping; the two models alternate step by step in one process (who goes
first alternates too), so a noisy, shared machine slows both alike and the speed ratio holds.
Used by ``benchmarks/conll.py`` and ``benchmarks/squad.py``; the others share its timing,
reports and padded batches."""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch

from attnlab import hardware


def arguments(doc: str, data: str, epochs: float, batch: int,
              max_len: int) -> argparse.ArgumentParser:
    """The options both benchmarks share, with their own defaults."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--data", default=data)
    p.add_argument("--minutes", type=float, default=30.0, help="attnlab's training time")
    p.add_argument("--epochs", type=float, default=epochs, help="the schedule's length")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--max-len", type=int, default=max_len)
    return p


def training_arguments(doc: str, steps: int, batch: int, length: int,
                       layers: int) -> argparse.ArgumentParser:
    """The options of the training-throughput pairs (train_marian.py, train_bert_mlm.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: torch.autocast(cpu, bfloat16) around both forwards")
    p.add_argument("--steps", type=int, default=steps, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--len", type=int, default=length, help="tokens a sequence")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="initial weights and batches")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after the timed run, profile this many more steps of each side: the "
                   "matrix products' share and rate against this machine's square-GEMM peak")
    return p


def padded_batch(vocab: int, n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of ``n`` rows of ``length`` random tokens; with more than one row, every
    fourth row padded after a random length (the encoder benchmarks' batches)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    for row in range(0, n, 4) if n > 1 else ():
        cut = int(torch.randint(length // 4, length, (1,), generator=g))
        mask[row, cut:] = 0
        ids[row, cut:] = 0
    return ids, mask


def describe() -> str:
    return (f"{hardware.report()}\ntorch {torch.__version__}, Python "
            f"{platform.python_version()}, {torch.get_num_threads()} threads")


def optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.01):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


def linear_schedule(opt, warmup: int, steps: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train_pair(runs: dict[str, tuple[torch.nn.Module, Callable]], batches, steps: int,
               lr: float, warmup: int, budget_s: float, log_every: int = 50) -> dict:
    """Train every ``(model, loss(model, batch))`` of ``runs`` on each batch in turn for
    ``steps`` steps or until the first run has trained ``budget_s`` seconds; returns the
    seconds each spent and the steps done."""
    opts = {name: optimizer(m, lr) for name, (m, _) in runs.items()}
    scheds = {name: linear_schedule(o, warmup, steps) for name, o in opts.items()}
    seconds = dict.fromkeys(runs, 0.0)
    losses = {name: [] for name in runs}
    first = next(iter(runs))
    done = 0
    for m, _ in runs.values():
        m.train()
    for step in range(steps):
        batch = next(batches)
        order = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in order:
            model, loss_fn = runs[name]
            start = time.perf_counter()
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                           1.0)
            opts[name].step()
            scheds[name].step()
            opts[name].zero_grad(set_to_none=True)
            seconds[name] += time.perf_counter() - start
            losses[name].append(loss.item())
        done = step + 1
        if done % log_every == 0:
            print(f"step {done}: " + ", ".join(
                f"{n} loss {sum(v[-log_every:]) / log_every:.4f} ({seconds[n]:.0f} s)"
                for n, v in losses.items()), flush=True)
        if seconds[first] >= budget_s:
            break
    for m, _ in runs.values():
        m.eval()
    return {"seconds": seconds, "steps": done}


def timed_steps(models: dict[str, torch.nn.Module], batches: list, loss_of: Callable,
                lr: float, warmup_steps: int, bf16: bool) -> tuple[dict, dict]:
    """Train each model on every batch in turn, alternating who goes first, under
    ``torch.autocast`` to bf16 when ``bf16``: ``loss_of(name, model, batch)`` gives the loss.
    AdamW (:func:`optimizer`), constant ``lr``, clipping 1.0. Returns the seconds each spent
    after ``warmup_steps`` untimed steps, and each one's losses, step by step."""
    opts = {k: optimizer(m.train(), lr) for k, m in models.items()}
    seconds = dict.fromkeys(models, 0.0)
    losses: dict[str, list[float]] = {k: [] for k in models}
    for step, batch in enumerate(batches):
        order = list(models) if step % 2 == 0 else list(models)[::-1]
        for name in order:  # alternate, and alternate who goes first: noise hits both alike
            model = models[name]
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_of(name, model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            if step >= warmup_steps:
                seconds[name] += time.perf_counter() - start
            losses[name].append(loss.item())
        if step == 0:
            print("step 1 loss: " + ", ".join(f"{k} {v[0]:.6f}" for k, v in losses.items()))
    return seconds, losses


PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def gemm_peak(bf16: bool, n: int = 2048) -> float:
    """GFLOP/s of this machine's square GEMM (``n`` × ``n`` × ``n``, best of 5) in the step's
    dtype and threads: the rate a training step's matrix products cannot pass."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def profile_steps(models: dict[str, torch.nn.Module], batches: list, loss_of: Callable,
                  lr: float, bf16: bool) -> None:
    """Where each side's training step goes, under ``torch.profiler`` with FLOPs counted: the
    matrix products' (:data:`PRODUCTS`, forward and backward) share of the step and the rate
    they run at, against :func:`gemm_peak`."""
    peak = gemm_peak(bf16)
    print(f"square GEMM here: {peak:.0f} GFLOP/s ({'bf16' if bf16 else 'fp32'}, "
          f"{torch.get_num_threads()} threads)")
    for name, model in models.items():
        opt = optimizer(model.train(), lr)

        def step(batch, model=model, opt=opt, name=name):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_of(name, model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        step(batches[0])  # the optimiser's state, outside the profile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    with_flops=True) as prof:
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            total = time.perf_counter() - start
        products = [e for e in prof.key_averages() if e.key in PRODUCTS]
        busy = sum(e.self_cpu_time_total for e in products) / 1e6
        flops = sum(e.flops for e in products)
        rate = flops / max(busy, 1e-9) / 1e9
        print(f"{name}: {1000 * total / len(batches):.1f} ms a step under the profiler; matrix "
              f"products {100 * busy / total:.0f}% of it, {flops / len(batches) / 1e9:.1f} GFLOP a "
              f"step at {rate:.0f} GFLOP/s ({100 * rate / peak:.0f}% of the square GEMM's)")


def report(tokens: int, seconds: dict[str, float], losses: dict[str, list[float]]) -> None:
    """Tokens/s of each side, the largest gap between their losses, and the speed ratio."""
    rates = {k: tokens / seconds[k] for k in seconds}
    for name in rates:
        print(f"{name}: {rates[name]:,.0f} training tokens/s, last loss {losses[name][-1]:.6f}")
    gap = max(abs(a - b) for a, b in zip(*losses.values(), strict=True))
    print(f"largest |loss difference| over {len(next(iter(losses.values())))} steps: {gap:.2e}")
    print(f"speed ratio attnlab / transformers: {rates['attnlab'] / rates['transformers']:.2f}x")
