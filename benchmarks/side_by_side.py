"""Fine-tuning attnlab and transformers side by side: the same starting weights, the same
batches in the same order, the same AdamW (weight decay on matrices only), linear warmup and
decay, and gradient clipping; the two models alternate step by step in one process (who goes
first alternates too), so a noisy, shared machine slows both alike and the speed ratio holds.
Used by ``benchmarks/conll.py`` and ``benchmarks/squad.py``."""

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
