"""The training loop: the paper's recipe, resumable, distributable, observable.

Each optimizer step:

1. take ``accumulate`` micro-batches and count their real target tokens N (summed over all
   ranks when distributed), so the step optimises Σ loss / N of the whole global batch;
2. forward under bf16/fp16 autocast when asked (fp16 with dynamic loss scaling),
   label-smoothed loss, backward;
3. clip the global gradient norm, set the scheduled learning rate, Adam step;
4. stop at once, keeping the last good checkpoint, if the loss is NaN or inf.

Every ``eval_every`` steps a validation pass gives the loss (and, for a task that classifies,
the accuracy); training stops early after ``patience`` passes without a better loss, or at the
first pass whose accuracy reaches ``stop_at_accuracy``, or when ``time_budget`` is spent. A run
with a time budget times its first steps and replans: the run and its schedule end at the step
count that fits (:class:`~attnlab.training.schedule.BudgetPlan`).

Checkpoints hold everything a resumed run needs to continue *exactly*: weights, optimizer
moments, RNG states, data position and step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab import hardware
from attnlab.data.stream import to_device
from attnlab.errors import AttnlabError, BadInput, Stopped, WriteFailed
from attnlab.storage import (
    BEST,
    CHECKPOINTS,
    list_checkpoints,
    load_weights,
    remove_temporaries,
    save_model_dir,
)
from attnlab.training import distributed, parallel, sharded
from attnlab.training.checkpoint import last_good, load_trainer_state, save_checkpoint
from attnlab.training.guard import StopSignals
from attnlab.training.objectives import classification_metrics, evaluate
from attnlab.training.schedule import (
    BudgetPlan,
    replanned,
    schedule_from_dict,
    schedule_to_dict,
)
from attnlab.training.train_config import TrainConfig, build_optimizer


class TrainingDiverged(AttnlabError, RuntimeError):
    """The loss became NaN or inf; the message names the step and the checkpoint kept."""


_FAULT_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}


def _fault_hook():
    """Fault injection for the interruption tests: ATTNLAB_FAULT="SIG@POINT:N[,...]" sends
    this process SIG (kill, term or int) at POINT (``step``: after optimizer step N;
    ``checkpoint``: while writing step N's checkpoint), e.g. "term@step:6,term@checkpoint:6"."""
    spec = os.environ.get("ATTNLAB_FAULT")
    if not spec:
        return None
    faults = []
    for item in spec.split(","):
        sig, _, rest = item.partition("@")
        where, _, step = rest.partition(":")
        faults.append((_FAULT_SIGNALS[sig], where, int(step)))

    def fault(point: str, current: int) -> None:
        for sig, where, step in faults:
            if point == where and current == step:
                os.kill(os.getpid(), sig)

    return fault


def _step_of(row: str) -> float:
    """A metrics row's step; a row that does not parse (torn by a crash) sorts last."""
    try:
        return json.loads(row)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


class Trainer:
    """Trains ``model`` on ``batches`` (e.g. :class:`TranslationBatches`, :class:`LMBatches`);
    ``task`` (:mod:`attnlab.training.objectives`) says how a batch becomes a loss. Each validation
    pass (``val_batches``, every ``eval_every`` steps) is one line through ``log`` on rank 0,
    above the progress bar: ``step 250: val loss 2.5712 (best 2.5712)``, and for a task that
    classifies (one with ``logits``) ``, accuracy 0.9653``. With a time budget, ``total`` and
    ``schedule`` become the plan's and ``budget_note`` says what the budget did."""

    clock = staticmethod(time.perf_counter)  # the seconds a time budget counts (tests fake it)

    def __init__(self, model: nn.Module, batches, config: TrainConfig, out_dir: str | Path,
                 tokenizers: dict[str, dict], model_config, task, val_batches=None, log=print):
        self.cfg, self.log = config, log
        self.out_dir = Path(out_dir)
        self.rank, self.world = distributed.rank_and_world()
        self.is_main = self.rank == 0
        self.model = model
        self.model_config = model_config
        self.tokenizers = tokenizers
        self.task, self.val_batches = task, val_batches
        self.classifies = hasattr(task, "logits")
        if config.stop_at_accuracy is not None and not (
                self.classifies and val_batches and config.eval_every):
            raise BadInput("stop_at_accuracy needs a task that classifies, validation data and "
                           "eval_every > 0")
        self.device = next(model.parameters()).device
        self.precision = hardware.pick_precision(config.precision, self.device)
        # the plan: who holds which part of the model (parallel.place), and this rank's data
        self.plan = config.plan()
        self.plan.check(model_config)
        placed = parallel.place(model, task, self.plan, self.device, self.precision)
        self.layout, self.pipeline, self.autocast = placed.layout, placed.pipeline, placed.autocast
        self.trained, self.train_model = placed.trained, placed.train_model
        self.batches = batches.shard(self.layout.dp_rank, self.plan.dp)
        self.schedule = schedule_from_dict(config.schedule)
        self.total = config.steps  # the run's last step (a time budget replans it)
        self.budget_note: str | None = None
        self.scaler = parallel.grad_scaler(self.plan, self.device, self.precision)  # fp16 only
        self.optimizer = build_optimizer(self.trained, config, self.schedule(1),
                                         fused=not (self.scaler and self.plan.sharded))
        if (config.layer_decay != 1 or config.unfreeze_every) and (
                self.world > 1 or config.parallel_asked):
            raise BadInput("layer_decay and unfreeze_every train on one process (no torchrun, "
                           "--parallel, --tp or --pp)")
        if config.compile:
            self.train_model = torch.compile(self.train_model)
        self.step = self.saved_step = 0
        self.best_val, self.evals_since_best = math.inf, 0  # the best so far; early stopping
        self.fault = _fault_hook()
        self.ckpt_dir = self.out_dir / CHECKPOINTS
        self.metrics_path = self.out_dir / "metrics.jsonl"

    # --- state ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What ``trainer_state.pt`` holds. A sharded run keeps the optimizer in DCP's shards
        (:mod:`attnlab.training.sharded`) instead, and notes whether tensor parallelism had
        split fused QKV matrices (the shards' names say so)."""
        optimizer = ({"qkv_split": self.qkv_split, "pp": self.plan.pp} if self.plan.sharded
                     else {"optimizer": self.optimizer.state_dict()})  # (sharded.resumable)
        return {
            "step": self.step,
            **optimizer,
            "torch_rng": torch.get_rng_state(),
            "python_rng": list(random.getstate()[1]),
            "data": self.batches.state_dict(),
            "schedule": schedule_to_dict(self.schedule),
            "best_val": self.best_val,
            "evals_since_best": self.evals_since_best,
            **({"scaler": self.scaler.state_dict()} if self.scaler else {}),
        }

    @property
    def qkv_split(self) -> bool:
        return self.plan.tp > 1 and bool(self.model_config.fused_qkv)

    def save(self) -> Path | None:
        """Write this step's checkpoint (:func:`save_checkpoint`): rank 0 writes it, and under
        a sharded plan every rank writes its shards into it and rank 0 writes the gathered
        weights around them; a failed write names the last good one."""
        self.saved_step = self.step
        if not (self.plan.sharded or self.is_main):
            return None
        shards = (self.trained, self.optimizer) if self.plan.sharded else None
        model = self._plain_on_main() if self.plan.sharded else self.model
        return save_checkpoint(self.ckpt_dir, self.step, model, self.model_config,
                               self.tokenizers, self.state() if self.is_main else None,
                               self.cfg.keep_last, self.fault, shards)

    def _plain_on_main(self) -> nn.Module | None:
        """A sharded run's model as one plain module of its gathered weights on rank 0 (None
        on the others); every rank must call it (the weights are gathered collectively)."""
        full = (self.pipeline.full_state_dict() if self.pipeline is not None
                else sharded.full_model_state(self.model))
        return sharded.plain_model(full, self.model_config, self.qkv_split) \
            if self.is_main else None

    def full_model(self) -> nn.Module:
        """The trained model, whole, on every rank: the model itself, or under a sharded plan
        a plain copy of its gathered weights (what the recipes score and save after
        training). Every rank must call it."""
        if not self.plan.sharded:
            return self.model
        plain = self._plain_on_main()
        state = [plain.state_dict() if plain is not None else None]  # CPU tensors
        distributed.broadcast_from_main(state)
        if plain is None:
            plain = sharded.plain_model(state[0], self.model_config)
        return plain.to(self.device)

    def _keep_best(self) -> None:
        """This model into ``out_dir/best`` (rank 0 writes; every rank calls it, and a failed
        write stops every rank)."""
        model = self._plain_on_main() if self.plan.sharded else self.model
        distributed.from_main(lambda: save_model_dir(
            self.out_dir / BEST, model, self.model_config, self.tokenizers, step=self.step))

    def resume(self) -> bool:
        """Continue from the newest checkpoint in ``out_dir``; False if there is none. A
        sharded checkpoint resumes on any number of ranks (DCP reshards it)."""
        found = list_checkpoints(self.ckpt_dir)
        if not found:
            return False
        state = load_trainer_state(found[-1])
        layout = {"pp": self.plan.pp, "qkv_split": self.qkv_split}
        if sharded.resumable(found[-1], state, self.plan.sharded, layout):
            sharded.load_sharded(found[-1] / sharded.SHARDED, self.trained, self.optimizer)
        else:
            load_weights(self.model, found[-1])
            self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate((3, tuple(state["python_rng"]), None))
        self.batches.load_state_dict(state["data"])
        self.step = self.saved_step = int(state["step"])
        self.best_val = float(state.get("best_val", math.inf))
        self.evals_since_best = int(state.get("evals_since_best", 0))
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        if self.layout.dp_rank > 0:  # only rank 0's RNG state is saved; others re-seed dropout
            torch.manual_seed(self.cfg.seed + self.layout.dp_rank + 7919 * self.step)
        if self.is_main and self.metrics_path.exists():  # drop rows the resumed run redoes
            rows = self.metrics_path.read_text().splitlines()
            kept = [r for r in rows if _step_of(r) <= self.step]  # a torn last row goes too
            self.metrics_path.write_text("".join(r + "\n" for r in kept))
        return True

    # --- one step ------------------------------------------------------------------------
    def train_step(self, data_iter) -> dict[str, float]:
        micro = [to_device(next(data_iter), self.device) for _ in range(self.cfg.accumulate)]
        dp_group = self.layout.dp_group
        local_tokens = sum(self.task.target_tokens(b) for b in micro)
        global_tokens = distributed.all_reduce_sum(local_tokens, dp_group)
        # DDP and FSDP average gradients over the data-parallel ranks, hence × dp: the result
        # is Σ loss / N_global. (Tensor- and pipeline-parallel ranks share their batch.)
        scale = self.plan.dp / global_tokens
        lr = self.schedule(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # layer decay: ξ^(top − depth)
        self._unfreeze()
        loss_sum = nll_sum = 0.0
        src_tokens = 0
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1  # gradients cross ranks once, after the last one
            if self.plan.strategy == "fsdp" and self.pipeline is None and len(micro) > 1:
                self.trained.set_requires_gradient_sync(last)
            if self.pipeline is not None:
                with hardware.autocast(self.device, self.autocast):
                    loss, nll = self.pipeline.step(batch, scale)
            else:
                ddp = isinstance(self.train_model, nn.parallel.DistributedDataParallel)
                with (self.train_model.no_sync() if ddp and not last
                      else contextlib.nullcontext()):
                    with hardware.autocast(self.device, self.autocast):
                        sums = self.task.loss(self.train_model, batch)
                    scaled = sums.loss * scale
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                loss, nll = sums.loss.item(), sums.nll.item()
            loss_sum += loss
            nll_sum += nll
            src_tokens += self.task.source_tokens(batch)
        # only the last stage of a pipeline has the loss: the others add zeros
        sum_group = self.layout.pp_group if self.pipeline is not None else dp_group
        loss_sum = distributed.all_reduce_sum(loss_sum, sum_group)
        nll_sum = distributed.all_reduce_sum(nll_sum, sum_group)
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"loss became {loss_sum} at step {self.step + 1}; training stopped, last good "
                f"checkpoint: {last_good(self.ckpt_dir)}"
            )
        if self.pipeline is not None:
            self.pipeline.sync_tied()
        if self.scaler:  # clip the true gradients; an overflowing step is skipped by step()
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"loss": loss_sum / global_tokens, "nll": nll_sum / global_tokens,
                "ppl": math.exp(min(nll_sum / global_tokens, 50)), "lr": lr,
                "grad_norm": float(grad_norm), "tgt_tokens": global_tokens,
                "src_tokens": distributed.all_reduce_sum(src_tokens, dp_group)}

    def _unfreeze(self) -> None:
        """Progressive unfreezing (Howard & Ruder, 2018): the top depth group trains from the
        start, and one more group below it every ``unfreeze_every`` steps; a frozen group
        gets no gradient (its optimizer state does not move)."""
        every = self.cfg.unfreeze_every
        if not every:
            return
        groups = self.optimizer.param_groups
        top = max(g["depth"] for g in groups)
        lowest = top - self.step // every  # the lowest depth that trains at this step
        for group in groups:
            for p in group["params"]:
                p.requires_grad_(group["depth"] >= lowest)

    def _clip(self) -> torch.Tensor:
        """Clip the norm of the whole model's gradient: over every shard and stage when the
        model is split (a tied weight's second copy in a pipeline counts once)."""
        if not self.cfg.clip_norm:
            return torch.tensor(0.0)
        if not self.plan.sharded:
            return nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        staged = self.pipeline is not None
        return parallel.clip_grad_norm(self.trained.parameters(), self.cfg.clip_norm,
                                       self.layout.pp_group if staged else None,
                                       self.pipeline.norm_parameters() if staged else None)

    def _write_metrics(self, metrics, row: dict[str, float]) -> None:
        try:
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
        except OSError as e:
            raise WriteFailed(f"{self.metrics_path}: could not be written ({e.strerror or e}); "
                              f"training stopped at step {self.step}, last good checkpoint: "
                              f"{last_good(self.ckpt_dir)}") from None

    def _track_best(self, val_loss: float) -> bool:
        """Note the best validation loss so far and, when early stopping is on, keep that
        model in ``out_dir/best``. Returns True when ``patience`` validation passes in a row
        brought no improvement (never when early stopping is off)."""
        if val_loss < self.best_val:
            self.best_val, self.evals_since_best = val_loss, 0
            if self.cfg.patience:
                self._keep_best()
        else:
            self.evals_since_best += 1
        return bool(self.cfg.patience) and self.evals_since_best >= self.cfg.patience

    def _validate(self, bar) -> dict[str, float]:
        """One validation pass, said on rank 0 with the best loss so far, above the progress
        bar (a plain line when the bar is off). Returns ``val_loss`` (for
        :meth:`_track_best`) and, for a task that classifies, ``val_accuracy``."""
        if self.pipeline is not None:
            with hardware.autocast(self.device, self.autocast):
                found = {"val_loss": self.pipeline.evaluate(self.val_batches)}
        else:
            found = {"val_loss": evaluate(self.model, self.task, self.val_batches, self.device,
                                          self.autocast)}
        line = (f"step {self.step}: val loss {found['val_loss']:.4f} "
                f"(best {min(found['val_loss'], self.best_val):.4f})")
        if self.classifies:
            with hardware.autocast(self.device, self.autocast):
                found["val_accuracy"] = classification_metrics(
                    self.model, self.val_batches, self.device, self.model_config.num_labels,
                    self.task)["accuracy"]
            line += f", accuracy {found['val_accuracy']:.4f}"
        if self.is_main:
            with bar.external_write_mode():  # clears the bar, then draws it again below
                self.log(line)
        return found

    def _reached(self, found: dict[str, float], bar) -> bool:
        """Whether this validation pass met ``stop_at_accuracy``; if so, on rank 0, that is
        said and, with early stopping on, this model becomes ``best/`` (the one the criterion
        picked, whatever its loss)."""
        target = self.cfg.stop_at_accuracy
        if target is None or found["val_accuracy"] < target:
            return False
        if self.cfg.patience and self.evals_since_best:  # (else _track_best just saved it)
            self._keep_best()
        if self.is_main:
            with bar.external_write_mode():
                self.log(f"step {self.step}: validation accuracy {found['val_accuracy']:.4f} "
                         f">= {target}: stopping")
        return True

    # --- the time budget -----------------------------------------------------------------
    def _replan(self, plan: BudgetPlan, elapsed: float, bar) -> None:
        """Once the first steps are timed (rank 0's timing, for every rank): the run and its
        schedule end at the step count the budget allows, which is said above the bar."""
        agreed = [plan.observe(self.step, elapsed)]
        distributed.broadcast_from_main(agreed)
        plan.planned = agreed[0]  # (another rank may have measured sooner: rank 0 decides)
        if plan.planned is None:
            return
        self.total = plan.planned
        self.schedule = replanned(self.schedule, self.total)
        bar.total = self.total
        bar.refresh()
        if self.is_main and plan.seconds_per_step is not None:
            with bar.external_write_mode():
                self.log(plan.line())

    # --- the loop ------------------------------------------------------------------------
    def fit(self) -> list[dict[str, float]]:
        from tqdm import tqdm

        if self.step == 0:  # fresh run: seed dropout (a resumed run restored its RNG state);
            # tensor-parallel ranks share their data rank's seed: replicated activations must
            # drop the same units
            torch.manual_seed(self.cfg.seed + self.layout.dp_rank)
        self.total = self.cfg.steps  # as asked now (a caller may extend a finished run)
        self.model.train()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        data_iter = iter(self.batches)
        history: list[dict[str, float]] = []
        bar = tqdm(total=self.total, initial=self.step, disable=not (
            self.is_main and self.cfg.progress), dynamic_ncols=True, unit="step")
        budget = self.cfg.time_budget
        plan = BudgetPlan(budget, self.cfg.steps, self.step) if budget is not None else None
        start, tokens, budget_over = self.clock(), 0, False
        # A fresh run starts a new metrics file; a resumed one appends (resume() trimmed it).
        mode = "w" if self.step == 0 else "a"
        metrics = open(self.metrics_path, mode) if self.is_main else None
        if self.is_main:
            for folder in (self.ckpt_dir, self.out_dir):  # left by writes that were killed
                remove_temporaries(folder)
        try:
            with StopSignals(repeat_stops_at_once=self.world == 1) as stop:
                while self.step < self.total:
                    row = self.train_step(data_iter)
                    if self.fault is not None:
                        self.fault("step", self.step)
                    elapsed = self.clock() - start
                    if plan is not None and plan.planned is None:
                        self._replan(plan, elapsed, bar)
                    tokens += row["src_tokens"] + row["tgt_tokens"]
                    row.update(step=self.step, time=elapsed, tokens_per_s=tokens / elapsed)
                    if self.val_batches and self.cfg.eval_every and (
                            self.step % self.cfg.eval_every == 0 or self.step == self.total):
                        found = self._validate(bar)
                        # one decision for all ranks (early stopping and best/ are collective)
                        agreed = [found]
                        distributed.broadcast_from_main(agreed)
                        found = agreed[0]
                        row.update(found)
                        stop_early = self._track_best(row["val_loss"])
                        stop_early = self._reached(found, bar) or stop_early
                    else:
                        stop_early = False
                    history.append(row)
                    if metrics is not None:
                        self._write_metrics(metrics, row)
                    bar.update(1)
                    if self.step % self.cfg.log_every == 0:
                        bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}",
                                        tok_s=f"{row['tokens_per_s']:.0f}")
                    budget_over = budget is not None and distributed.any_true(elapsed >= budget)
                    signalled = distributed.any_true(stop.signum is not None)
                    if (self.step % self.cfg.save_every == 0 or budget_over or stop_early
                            or signalled):
                        saved = self.save()
                    if signalled:  # the step is finished and saved: stop as asked
                        distributed.barrier()  # no rank leaves before rank 0 has saved
                        signum = stop.signum or signal.SIGTERM  # (another rank's signal)
                        raise Stopped(f"{signal.Signals(signum).name} at step {self.step}; "
                                      f"checkpoint {saved or self.ckpt_dir} (continue with "
                                      "--resume)", signum)
                    budget_over = budget_over and self.step < self.total
                    if budget_over and self.is_main:  # said: the bar counted the steps
                        with bar.external_write_mode():
                            self.log(f"--time-budget {budget:g} s spent: stopped at step "
                                     f"{self.step} of {self.total}")
                    if budget_over or stop_early:
                        break
                if self.saved_step != self.step:  # (known on every rank alike)
                    self.save()
                if plan is not None:
                    self.budget_note = plan.note(self.step, self.total, budget_over)
        finally:
            bar.close()
            if metrics is not None:
                metrics.close()
        return history


__all__ = ["Trainer", "TrainConfig", "TrainingDiverged"]
