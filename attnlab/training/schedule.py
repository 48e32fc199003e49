"""Learning-rate schedules, as functions of the (1-based) optimizer step.

The paper's schedule (section 5.3), linear warmup then inverse-square-root decay:

    lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

peaking at step = warmup with lr = factor · (d_model · warmup)^-0.5 (6.988e-4 for d_model 512,
warmup 4000). GPT-style training uses linear warmup then cosine decay to ``min_lr``; BERT
uses linear warmup then linear decay to 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attnlab.config import check_at_least
from attnlab.errors import BadInput


def _check(schedule, **minimums: float) -> None:
    """Learning rates must be positive: a zero or negative peak trains nothing, silently."""
    lr_name = "factor" if isinstance(schedule, NoamSchedule) else "peak_lr"
    if not getattr(schedule, lr_name) > 0:
        raise BadInput(f"the learning rate {lr_name} must be > 0, got "
                       f"{getattr(schedule, lr_name)!r}")
    check_at_least(schedule, minimums)


@dataclass
class NoamSchedule:
    d_model: int = 512
    warmup: int = 4000
    factor: float = 1.0

    def __post_init__(self) -> None:
        _check(self, d_model=1, warmup=1)

    def __call__(self, step: int) -> float:
        step = max(step, 1)
        return self.factor * self.d_model**-0.5 * min(step**-0.5, step * self.warmup**-1.5)


@dataclass
class CosineSchedule:
    peak_lr: float = 1e-3
    warmup: int = 100
    total_steps: int = 10000
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        _check(self, warmup=0, total_steps=1, min_lr=0.0)

    def __call__(self, step: int) -> float:
        step = max(step, 1)
        if step <= self.warmup:
            return self.peak_lr * step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1 + math.cos(math.pi * progress))


@dataclass
class LinearSchedule:
    """``peak · step / warmup`` up to ``warmup``, then linearly down to 0 at ``total_steps``."""

    peak_lr: float = 1e-4
    warmup: int = 100
    total_steps: int = 10000

    def __post_init__(self) -> None:
        _check(self, warmup=0, total_steps=1)

    def __call__(self, step: int) -> float:
        step = max(step, 1)
        if step <= self.warmup:
            return self.peak_lr * step / self.warmup
        return self.peak_lr * max(0.0, (self.total_steps - step)
                                  / max(1, self.total_steps - self.warmup))


SCHEDULES = {"noam": NoamSchedule, "cosine": CosineSchedule, "linear": LinearSchedule}


def schedule_to_dict(schedule) -> dict:
    return {"kind": next(k for k, v in SCHEDULES.items() if isinstance(schedule, v)),
            **asdict(schedule)}


def schedule_from_dict(data: dict):
    data = dict(data)
    return SCHEDULES[data.pop("kind")](**data)
