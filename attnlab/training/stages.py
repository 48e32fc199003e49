"""Pipeline parallelism: a language model's layers cut into N stages, one a rank, and each batch
run through them as B micro-batches by PyTorch's own engine (``torch.distributed.pipelining``:
:class:`PipelineStage`, :class:`ScheduleGPipe`, :class:`Schedule1F1B`).

The split (:func:`attnlab.placement.stage_sizes`, the same one the memory estimate counts):

    stage s of N holds layers [lo_s, hi_s): ⌊L/N⌋ or ⌈L/N⌉ of them, the first L mod N stages
    one more, so the largest holds ⌈L/N⌉ and none is empty (N ≤ L);
    stage 0 also the embeddings, stage N−1 the final norm and the head (and, when the head is
    tied to the embedding, its own copy of that matrix: see :meth:`Pipeline.sync_tied`).

A batch of R rows becomes B micro-batches of R/B rows (dim 0). With t = t_f + t_b the time of
one micro-batch's forward and backward on one stage, both schedules take (B + N − 1)·t a step
where N perfectly overlapped stages would take B·t:

    efficiency = B / (B + N − 1),        bubble = (N − 1) / (B + N − 1)

(B = 8, N = 4: 73 %). They differ in memory: GPipe runs every forward, then every backward, so
a stage keeps the activations of all B micro-batches; 1F1B alternates one forward and one
backward once the pipeline is full, so stage s keeps at most N − s (and needs B ≥ N).

What travels between stages: only the hidden states ``(R/B, S, d_model)`` forward and their
gradients backward, in the model's parameter dtype. Every rank has the whole batch, so each
stage computes the rest itself and gets it as keyword arguments, which the schedule cuts into
micro-batches like the inputs: the positions (for RoPE and ALiBi inside every layer), BERT's
padding mask (every layer's attention needs it), the token types (first stage) and the selected
positions of masked LM (last stage). No integer or boolean tensor goes over the wire.

The loss: the last stage's loss function returns ``scale × Σ loss`` of its micro-batch and the
schedule is built with ``scale_grads=False``, so the gradients add up over micro-batches to those
of ``(task.loss(model, batch).loss * scale).backward()`` in one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

from attnlab.data.stream import to_device
from attnlab.errors import BadInput
from attnlab.models.bert import BERT
from attnlab.models.gpt import GPT
from attnlab.placement import check_parallel, pipeline_layers, stage_sizes
from attnlab.training.loss import label_smoothed_loss
from attnlab.training.objectives import CausalLM, MaskedLM

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
CPU = torch.device("cpu")
# the parts outside the layer stack that the first stage owns, and the last stage's head
_EMBEDDINGS = {GPT: ("embed",), BERT: ("embed", "segment", "embed_norm", "embed_proj")}
_HEAD = {GPT: "lm_head", BERT: "mlm"}


class LayerSlice(nn.ModuleList):
    """Layers ``[lo, hi)`` of a stack, registered under their numbers in the whole stack (so a
    stage's parameter is named ``blocks.layers.3.ffn.w1.weight`` as in the unsplit model, and
    checkpoints map back) and iterated in order, as the stack's forward does. Indexing takes
    those numbers too: ``slice[3]``."""

    def __init__(self, layers: nn.ModuleList, lo: int, hi: int):
        super().__init__()
        for i in range(lo, hi):
            self.add_module(str(i), layers[i])

    def __getitem__(self, i: int) -> nn.Module:  # type: ignore[override]
        return self._modules[str(i)]


class _Stage(nn.Module):
    """One stage's forward pass, the model's own methods on the parts this stage holds.

    ``x``: token ids ``(b, S)`` on the first stage, the previous stage's hidden states ``(b, S,
    d_model)`` on the others. Returns hidden states ``(b, S, d_model)``; the last stage returns
    logits: ``(b, S, V)`` (GPT) or ``(n_selected, V)`` (BERT's mlm head at the selected
    positions only, as :class:`MaskedLM` computes them).
    """

    def __init__(self, model: GPT | BERT, first: bool, last: bool, dtype: torch.dtype):
        super().__init__()
        self.model, self.first, self.last, self.dtype = model, first, last, dtype

    def forward(self, x: Tensor, positions: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, selected: Tensor | None = None) -> Tensor:
        m = self.model
        if isinstance(m, GPT):
            if self.first:
                x = m.embed_tokens(x, positions)
            x = m.blocks(x, mask=m.block_mask(x.shape[1], x.device),
                         positional=m.positional, positions=positions)
            # the cast keeps what is sent equal to the shapes the stage was built with, also
            # under autocast (a no-op in fp32)
            return m.lm_head(x) if self.last else x.to(self.dtype)
        if self.first:
            x = m.embed_inputs(x, token_type_ids, positions)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        x = m.encoder(x, mask=mask, positional=m.positional, positions=positions)
        return m.mlm(x[selected]) if self.last else x.to(self.dtype)


class Pipeline:
    """Layers split into ``size`` stages, ⌈L/N⌉ at most a stage, this rank running stage
    ``rank`` under a GPipe or 1F1B schedule of ``microbatches`` micro-batches (module
    docstring: efficiency B / (B + N − 1) for B micro-batches and N stages).

    ``model`` (a :class:`GPT` for :class:`CausalLM`, a :class:`BERT` with the ``mlm`` head for
    :class:`MaskedLM`), built alike on every rank, is cut in place: afterwards it holds only
    this stage's parts, and ``self.module`` is it. Its parameters keep the unsplit model's names
    and are what this rank trains. Every method is called on every rank of the pipeline with
    the same batch.
    """

    module: nn.Module
    is_first: bool
    is_last: bool

    def __init__(self, model: nn.Module, task, rank: int, size: int,
                 group: dist.ProcessGroup | None, microbatches: int, schedule: str = "gpipe",
                 device: torch.device = CPU):
        check_parallel(model.config, size, pp=size)  # the rules info --parallel applies too
        _check_supported(model, task)
        n_layers = pipeline_layers(model.config)
        if schedule not in SCHEDULES:
            raise BadInput(f"pipeline schedule {schedule!r}: expected one of "
                           f"{', '.join(SCHEDULES)}")
        if microbatches < 1:
            raise BadInput(f"{microbatches} micro-batches: need at least 1")
        if schedule == "1f1b" and microbatches < size:
            raise BadInput(f"{microbatches} micro-batches for {size} stages: the 1f1b schedule "
                           f"needs at least one per stage")
        self.task, self.rank, self.size, self.group = task, rank, size, group
        self.microbatches, self.schedule, self.device = microbatches, schedule, device
        self.is_first, self.is_last = rank == 0, rank == size - 1
        self._keys = list(model.state_dict())  # the unsplit model's names, in its order
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        head = getattr(model, _HEAD[_family(model)])
        tied = head.weight is model.embed.weight  # GPT-2's tie_embeddings; BERT's mlm always
        sizes = stage_sizes(n_layers, size)
        lo = sum(sizes[:rank])
        self.layers = (lo, lo + sizes[rank])
        _cut(model, *self.layers, self.is_first, self.is_last)
        self.module = model
        self._forward = _Stage(model, self.is_first, self.is_last, dtype)
        self._dtype = dtype
        # the tied matrix on this rank (first stage: the embedding; last: the head's copy)
        self._tied: nn.Parameter | None = None
        self._tie_group: dist.ProcessGroup | None = None
        if tied and size > 1 and (self.is_first or self.is_last):
            self._tied = model.embed.weight if self.is_first else head.weight
            world = group if group is not None else dist.group.WORLD
            ends = [dist.get_global_rank(world, 0), dist.get_global_rank(world, size - 1)]
            # only the two end ranks call this (use_local_synchronization): the middle stages,
            # and the other pipelines of a dp × pp mesh, need not take part
            self._tie_group = dist.new_group(ends, use_local_synchronization=True)
        self._engine: ScheduleGPipe | Schedule1F1B | None = None
        self._shape: tuple[int, int] | None = None
        self._eval_engine: ScheduleGPipe | None = None
        self._eval_shape: tuple[int, int] | None = None
        self._scale = 1.0
        self._sums: list[tuple[Tensor, Tensor]] = []  # (loss, nll) of each micro-batch

    # --- one batch -------------------------------------------------------------------------
    def step(self, batch, scale: float) -> tuple[float, float]:
        """Forward and backward of ``batch`` (an :class:`LMBatch` for :class:`CausalLM`, a
        :class:`MaskedLMBatch` for :class:`MaskedLM`), cut into ``microbatches`` along dim 0.
        The gradients of ``scale × Σ loss`` accumulate into ``self.module``'s ``.grad``.
        Returns ``(loss_sum, nll_sum)`` of the whole batch, unscaled, on the last stage, and
        ``(0.0, 0.0)`` on the others."""
        args, kwargs, target = self._inputs(batch)
        rows, length = target.shape[:2]
        if rows % self.microbatches:
            raise BadInput(f"{self.microbatches} micro-batches do not divide the batch's {rows} "
                           f"rows (per rank); choose micro-batches that divide the batch size")
        self.module.config.check_length(length)
        self._scale, self._sums = scale, []
        stage_target = target if self.is_last else None
        if self.size == 1:  # one stage, nothing to schedule: gradient accumulation
            arg_mbs, kwarg_mbs = split_args_kwargs_into_chunks(args, kwargs, self.microbatches)
            for a, k, t in zip(arg_mbs, kwarg_mbs, target.tensor_split(self.microbatches),
                               strict=True):
                self._loss(self._forward(*a, **k), t).backward()
        else:
            self._engine_for(rows // self.microbatches, length).step(
                *args, target=stage_target, return_outputs=False, **kwargs)
        if not self.is_last:
            return 0.0, 0.0
        # the engine's calls of the loss are the last B (a version of torch that infers the
        # shapes by a trial run would call it once more before them)
        sums = self._sums[-self.microbatches:]
        return float(sum(s[0] for s in sums)), float(sum(s[1] for s in sums))

    def _inputs(self, batch) -> tuple[tuple[Tensor, ...], dict[str, Tensor], Tensor]:
        """The first stage's positional inputs, this stage's keyword inputs (each ``(rows,
        ...)``, cut into micro-batches by the schedule) and the targets ``(rows, S)``."""
        model = self.module
        if isinstance(self.task, CausalLM):
            ids, target = batch.inputs, batch.targets
            rows, length = ids.shape
            # GPT.features' positions for unpadded rows, one row each (kwargs are cut by rows)
            kwargs = {"positions": torch.arange(length, device=ids.device).expand(rows, length)}
        else:
            ids, target = batch.ids, batch.labels
            positions = model.positions(ids)  # BERT's rule (RoBERTa's offset), config only
            kwargs = {"positions": positions.expand(ids.shape),
                      "attention_mask": batch.attention_mask}
            if self.is_first:
                kwargs["token_type_ids"] = batch.token_type_ids
            if self.is_last:
                kwargs["selected"] = target != -100
        return ((ids,) if self.is_first else ()), kwargs, target

    def _engine_for(self, rows: int, length: int) -> ScheduleGPipe | Schedule1F1B:
        """The stage and schedule for micro-batches of ``rows × length`` tokens. Their shapes
        are given to the stage (PyTorch's static mode: no trial forward to infer them); a batch
        of another length (masked-LM batches are padded to their longest row) builds a new
        pair, on every rank alike since every rank sees the same batch."""
        if self._shape != (rows, length):
            self._engine = SCHEDULES[self.schedule](self._stage(rows, length), self.microbatches,
                                                    loss_fn=self._loss, scale_grads=False)
            self._shape = (rows, length)
        return self._engine

    def _stage(self, rows: int, length: int) -> PipelineStage:
        hidden = torch.empty(rows, length, self.module.config.d_model, dtype=self._dtype,
                             device="meta", requires_grad=True)
        ids = torch.empty(rows, length, dtype=torch.long, device="meta")
        # the last stage's output goes to the loss, never over the wire: its description is
        # not used, so the hidden states stand in for the logits
        return PipelineStage(self._forward, self.rank, self.size, self.device,
                             input_args=ids if self.is_first else hidden, output_args=hidden,
                             group=self.group)

    def _loss(self, output: Tensor, target: Tensor) -> Tensor:
        """``scale × Σ loss`` of one micro-batch, as the task computes it (records the unscaled
        sums). ``output``: logits ``(b, S, V)``, or ``(n_selected, V)`` for masked LM."""
        if isinstance(self.task, MaskedLM):
            sums = label_smoothed_loss(output, target[target != -100], 0.0, pad_id=None)
        else:
            sums = label_smoothed_loss(output, target, self.task.epsilon, pad_id=None)
        self._sums.append((sums.loss.detach(), sums.nll))
        return sums.loss * self._scale

    @torch.no_grad()
    def evaluate(self, batches) -> float:
        """Mean NLL per target token over ``batches`` (validation), forward only, each batch
        as one micro-batch through a GPipe schedule (validation batches need not divide into
        ``microbatches``); every rank of the pipeline returns the same value."""
        was_training = self.module.training
        self.module.eval()
        nll = tokens = 0.0
        for batch in batches:
            batch = to_device(batch, self.device)
            args, kwargs, target = self._inputs(batch)
            self._scale, self._sums = 1.0, []
            if self.size == 1:
                self._loss(self._forward(*args, **kwargs), target)
            else:
                self._eval_engine_for(*target.shape[:2]).eval(
                    *args, target=target if self.is_last else None, **kwargs)
            if self.is_last:
                nll += float(self._sums[-1][1])
                tokens += self.task.target_tokens(batch)
        self.module.train(was_training)
        totals = torch.tensor([nll, tokens], dtype=torch.float64)
        if self.size > 1:
            dist.all_reduce(totals, group=self.group)  # only the last stage's are non-zero
        return float(totals[0] / totals[1].clamp(min=1))

    def _eval_engine_for(self, rows: int, length: int) -> ScheduleGPipe:
        if self._eval_shape != (rows, length):
            self._eval_engine = ScheduleGPipe(self._stage(rows, length), 1, loss_fn=self._loss,
                                              scale_grads=False)
            self._eval_shape = (rows, length)
        return self._eval_engine

    # --- after backward --------------------------------------------------------------------
    def sync_tied(self) -> None:
        """Sum the gradient of a weight tied between the first stage's embedding and the last
        stage's head over those two stages (one all_reduce on their 2-rank group), so that
        both copies hold ∂L/∂E = ∂L/∂E|embedding + ∂L/∂E|head, as the unsplit model's one
        matrix would, and stay equal after the optimizer step. Call it after backward, before
        clipping; a no-op on the middle stages, with one stage, or when nothing is tied."""
        if self._tie_group is None or self._tied is None:
            return
        if self._tied.grad is None:
            self._tied.grad = torch.zeros_like(self._tied)
        dist.all_reduce(self._tied.grad, group=self._tie_group)

    def norm_parameters(self) -> list[nn.Parameter]:
        """This stage's parameters for the model's gradient norm: all of them, except the
        last stage's copy of a tied weight (after :meth:`sync_tied` it equals the first
        stage's, which counts it once)."""
        skip = self._tied if (self.is_last and not self.is_first) else None
        return [p for p in self.module.parameters() if p is not skip]

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Every stage's parameters and buffers gathered to the pipeline's rank 0 as CPU
        tensors, keyed and ordered as the unsplit model's ``state_dict()``; None on the other
        ranks."""
        state = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        if self.size > 1:
            parts: list[dict[str, Tensor]] | None = [{}] * self.size if self.is_first else None
            dist.gather_object(state, parts, group=self.group, group_dst=0)
            if not self.is_first:
                return None
            state = {}
            for part in parts:
                state.update(part)  # a tied matrix arrives from both ends, equal
        missing = [k for k in self._keys if k not in state]
        if missing:
            raise RuntimeError(f"pipeline stages hold no {', '.join(missing[:3])}")
        return {k: state[k] for k in self._keys}


def _check_supported(model: nn.Module, task) -> None:
    """Pipelines run GPT with CausalLM and BERT's masked LM; anything else is one line."""
    if isinstance(model, GPT) and type(task) is CausalLM:
        return
    if isinstance(model, BERT) and type(task) is MaskedLM:
        if model.config.head == "pretraining":
            raise BadInput("pipeline parallelism (--pp) does not support next-sentence "
                           "prediction (--nsp): train masked LM alone, or without --pp")
        if model.config.head == "mlm":
            return
    raise BadInput(
        f"pipeline parallelism (--pp) supports decoder-only and encoder-only language models; "
        f"{type(model).__name__} with task {type(task).__name__} is not pipelined (a choice: "
        f"one stage layout, embeddings -> layers -> LM head), train it without --pp")


def _cut(model: GPT | BERT, lo: int, hi: int, first: bool, last: bool) -> None:
    """Keep, in place, layers [lo, hi) and this stage's ends; the rest is dropped (freed once
    nothing else holds it). Names stay those of the unsplit model."""
    stack = model.blocks if isinstance(model, GPT) else model.encoder
    stack.layers = LayerSlice(stack.layers, lo, hi)
    if not last:
        stack.norm = nn.Identity()  # the final norm is the last stage's
        setattr(model, _HEAD[_family(model)], None)
    if not first:
        for name in _EMBEDDINGS[_family(model)]:
            setattr(model, name, None)
        # RoPE's and ALiBi's tables act in every layer and are buffers, computed alike on every
        # rank; learned positions are a parameter only the embedding (first stage) reads
        if any(True for _ in model.positional.parameters()):
            model.positional = None


def _family(model: GPT | BERT) -> type[GPT] | type[BERT]:
    return GPT if isinstance(model, GPT) else BERT
