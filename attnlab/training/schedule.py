"""Learning-rate schedules, as functions of the (1-based) optimizer step, and the plan of a
run's length under a time budget.

The paper's schedule (section 5.3), linear warmup then inverse-square-root decay:

    lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

peaking at step = warmup with lr = factor · (d_model · warmup)^-0.5 (6.988e-4 for d_model 512,
warmup 4000); :meth:`NoamSchedule.with_peak` picks the factor that peaks at a given rate.

The others count as transformers' ``get_*_schedule_with_warmup`` do, so that a run takes the
same rate at every step as a transformers run of the same settings. LambdaLR multiplies the
peak by λ(t), where t = step − 1 is the number of steps already taken (its scheduler starts at
0 and steps after the optimizer), so with T = total steps and W = warmup:

    warmup      λ(t) = t / W                                      for t < W (step 1: rate 0)
    cosine      λ(t) = r + (1 − r) · ½ (1 + cos(π p)),  p = (t − W) / (T − W),  r = min_lr / peak
    linear      λ(t) = (T − t) / (T − W)
    polynomial  λ(t) = ((peak − end) · (1 − p)^power + end) / peak
    constant    λ(t) = 1

GPT-style training uses cosine decay to ``min_lr``, BERT linear decay to 0 (BERT's own code:
polynomial with power 1).
"""

from __future__ import annotations

import dataclasses
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


def _warmup(t: int, warmup: int) -> float | None:
    """λ(t) while warming up (None after): t / W, from 0 at the first step."""
    return t / max(1, warmup) if t < warmup else None


@dataclass
class NoamSchedule:
    d_model: int = 512
    warmup: int = 4000
    factor: float = 1.0

    def __post_init__(self) -> None:
        _check(self, d_model=1, warmup=1)

    @classmethod
    def with_peak(cls, peak_lr: float, warmup: int, d_model: int) -> NoamSchedule:
        """The schedule whose rate at step ``warmup`` (its largest) is ``peak_lr``."""
        if not peak_lr > 0:
            raise BadInput(f"the learning rate peak_lr must be > 0, got {peak_lr!r}")
        return cls(d_model, warmup, peak_lr * math.sqrt(d_model * warmup))

    @property
    def peak_lr(self) -> float:
        return self.factor * (self.d_model * self.warmup) ** -0.5

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
        if not self.min_lr <= self.peak_lr:
            raise BadInput(f"min_lr {self.min_lr!r} must not exceed the peak {self.peak_lr!r}")

    def __call__(self, step: int) -> float:
        t = max(step, 1) - 1
        rising = _warmup(t, self.warmup)
        if rising is not None:
            return self.peak_lr * rising
        progress = min(1.0, (t - self.warmup) / max(1, self.total_steps - self.warmup))
        floor = self.min_lr / self.peak_lr
        return self.peak_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class LinearSchedule:
    peak_lr: float = 1e-4
    warmup: int = 100
    total_steps: int = 10000

    def __post_init__(self) -> None:
        _check(self, warmup=0, total_steps=1)

    def __call__(self, step: int) -> float:
        t = max(step, 1) - 1
        rising = _warmup(t, self.warmup)
        if rising is not None:
            return self.peak_lr * rising
        return self.peak_lr * max(0.0, (self.total_steps - t)
                                  / max(1, self.total_steps - self.warmup))


@dataclass
class PolynomialSchedule:
    """Decay from the peak to ``lr_end`` as ``(1 − p)^power`` (power 1: linear to lr_end)."""

    peak_lr: float = 1e-4
    warmup: int = 100
    total_steps: int = 10000
    lr_end: float = 1e-7
    power: float = 1.0

    def __post_init__(self) -> None:
        _check(self, warmup=0, total_steps=1, lr_end=0.0, power=0.0)
        if not self.lr_end < self.peak_lr:  # (transformers refuses it too)
            raise BadInput(f"lr_end {self.lr_end!r} must be below the peak {self.peak_lr!r}")

    def __call__(self, step: int) -> float:
        t = max(step, 1) - 1
        rising = _warmup(t, self.warmup)
        if rising is not None:
            return self.peak_lr * rising
        if t > self.total_steps:
            return self.lr_end
        remaining = 1 - (t - self.warmup) / max(1, self.total_steps - self.warmup)
        return (self.peak_lr - self.lr_end) * remaining**self.power + self.lr_end


@dataclass
class ConstantSchedule:
    peak_lr: float = 1e-4
    warmup: int = 0

    def __post_init__(self) -> None:
        _check(self, warmup=0)

    def __call__(self, step: int) -> float:
        rising = _warmup(max(step, 1) - 1, self.warmup)
        return self.peak_lr * (1.0 if rising is None else rising)


SCHEDULES = {"noam": NoamSchedule, "cosine": CosineSchedule, "linear": LinearSchedule,
             "polynomial": PolynomialSchedule, "constant": ConstantSchedule}


def make_schedule(kind: str, peak_lr: float | None, warmup: int, total_steps: int,
                  d_model: int = 512, factor: float = 1.0, min_lr: float = 0.0,
                  lr_end: float = 1e-7, power: float = 1.0):
    """The schedule ``kind`` (a key of :data:`SCHEDULES`) over ``total_steps``. Noam takes
    ``peak_lr`` as its rate at step ``warmup``, or without one ``factor``; the others need
    ``peak_lr``."""
    if kind not in SCHEDULES:
        raise BadInput(f"unknown schedule {kind!r} (one of {', '.join(SCHEDULES)})")
    if kind == "noam":
        warmup = max(warmup, 1)  # the formula divides by it
        return (NoamSchedule(d_model, warmup, factor) if peak_lr is None
                else NoamSchedule.with_peak(peak_lr, warmup, d_model))
    if peak_lr is None:
        raise BadInput(f"the {kind} schedule needs a peak learning rate")
    return {"cosine": lambda: CosineSchedule(peak_lr, warmup, total_steps, min_lr),
            "linear": lambda: LinearSchedule(peak_lr, warmup, total_steps),
            "polynomial": lambda: PolynomialSchedule(peak_lr, warmup, total_steps, lr_end,
                                                     power),
            "constant": lambda: ConstantSchedule(peak_lr, warmup)}[kind]()


def schedule_to_dict(schedule) -> dict:
    return {"kind": next(k for k, v in SCHEDULES.items() if isinstance(schedule, v)),
            **asdict(schedule)}


def schedule_from_dict(data: dict):
    data = dict(data)
    return SCHEDULES[data.pop("kind")](**data)


# --- a run's length under a time budget ------------------------------------------------------
def replanned(schedule, steps: int):
    """``schedule`` planned to end at ``steps``: a schedule with a length (cosine, linear,
    polynomial) keeps its shape, its warmup the same share of the run (100 of 2,000 steps: 50 of
    1,000), and decays to its end there. Noam and constant have no length: unchanged."""
    if not hasattr(schedule, "total_steps") or steps == schedule.total_steps:
        return schedule
    warmup = round(schedule.warmup * steps / schedule.total_steps)
    return dataclasses.replace(schedule, total_steps=steps, warmup=warmup)


@dataclass
class BudgetPlan:
    """How many steps fit in ``budget`` seconds, measured over the first steps of the run.

    The first step is left out of the measurement (it pays once for allocation, compilation and
    warm caches); the next ones are timed until ``MEASURE`` of them or a tenth of the budget,
    whichever comes first. Then ``planned`` = the steps done + the seconds left / the seconds a
    step, at most ``asked``: the schedule is replanned to end there (:func:`replanned`).
    Validation passes and checkpoints are not in the measurement, so the budget may still run
    out a little before ``planned``; the trainer then stops at the budget."""

    MEASURE = 10

    budget: float
    asked: int  # the steps the run was asked for (its --steps)
    start: int = 0  # the step the run (or its resumption) started from
    planned: int | None = None  # once measured
    seconds_per_step: float | None = None
    _first: tuple[int, float] | None = None  # (step, elapsed) when the first step ended

    def observe(self, step: int, elapsed: float) -> int | None:
        """After each step (``elapsed`` seconds since the run started): the planned step count,
        on the one call at which it becomes known; else None."""
        if self.planned is not None:
            return None
        if self._first is None:
            self._first = (step, elapsed)
        timed, spent = step - self._first[0], elapsed - self._first[1]
        measured = timed >= 1 and (timed >= self.MEASURE or spent >= self.budget / 10)
        if not (measured or step >= self.asked):
            return None
        self.seconds_per_step = spent / timed if timed else elapsed / max(1, step - self.start)
        left = max(0.0, self.budget - elapsed)
        fits = step + (math.floor(left / self.seconds_per_step) if self.seconds_per_step > 0
                       else self.asked)
        self.planned = max(step, min(self.asked, fits))
        return self.planned

    def line(self) -> str:
        """What the plan is, in one line: the budget, the seconds a step, and the steps planned
        of those asked for."""
        rate = f"{self.seconds_per_step:.3g} s a step"
        if self.planned >= self.asked:
            return (f"--time-budget {self.budget:g} s: {rate}; all {self.asked:,} steps fit "
                    f"(about {self.asked * self.seconds_per_step:.0f} s)")
        return (f"--time-budget {self.budget:g} s: {rate}; the schedule is planned for "
                f"{self.planned:,} of the {self.asked:,} steps")

    def note(self, step: int, total: int, spent: bool) -> str:
        """The run's end, in one line; ``spent``: the budget stopped it at ``step`` of
        ``total``."""
        budget = f"--time-budget {self.budget:g} s"
        if spent:
            return f"{budget} spent: stopped at step {step:,} of {total:,}"
        if self.planned is None or self.planned >= self.asked:
            return (f"{budget}: the {self.asked:,} step{'s' * (self.asked > 1)} asked for "
                    "fit in it")
        return (f"{budget}: the run and its schedule were planned for {self.planned:,} of the "
                f"{self.asked:,} steps asked for")
