"""Knowledge distillation: a small student trained to match a trained teacher.

**Soft targets** (Hinton, Vinyals and Dean, 2015). With logits ``z_s`` (student) and ``z_t``
(teacher) at temperature ``T``, ``p^T = softmax(z / T)``; per predicted token (or example)

    L = α · CE(y, softmax(z_s)) + (1 − α) · T² · KL(p_t^T ‖ p_s^T)

The T² keeps the soft term's gradients on the hard term's scale as T grows (their section 2).

**Hidden states** (DistilBERT's cosine loss, Sanh et al., 2019): with weight β, the student's
last-layer states are pulled towards the teacher's, ``β · (1 − cos(h_s, h_t))`` per real token;
the widths must match (a DistilBERT-style student keeps the teacher's width and drops layers).

**Sequence level** (Kim and Rush, 2016), for translation: the teacher translates the training
sources with beam search and the student trains on those translations as targets, with the
ordinary translation recipe (:func:`sequence_level_corpus`).

:class:`Distill` is an objective (``attnlab.training.objectives``) wrapping the data's own: the
trainer sees a loss like any other. The teacher runs under ``no_grad`` in eval mode, in the
student's precision.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.training.loss import LossSums, label_smoothed_loss
from attnlab.training.objectives import CausalLM, Classify, Seq2Seq
from attnlab.training.recipes import Prepared, Recipe, finish_classifier


def distillation_loss(student: Tensor, teacher: Tensor, target: Tensor, temperature: float,
                      alpha: float, pad_id: int | None = None) -> LossSums:
    """The soft-target loss above, summed over real targets: ``student``/``teacher`` logits
    ``(..., classes)``, ``target (...)`` (positions equal to ``pad_id`` left out). ``nll`` is
    the hard term's, so that perplexity and validation loss keep their meaning."""
    if temperature <= 0 or not 0 <= alpha <= 1:
        raise BadInput(f"distillation needs temperature > 0 and 0 <= alpha <= 1, got "
                       f"T={temperature}, alpha={alpha}")
    hard = label_smoothed_loss(student, target, 0.0, pad_id)
    real = (target != pad_id) if pad_id is not None else torch.ones_like(target, dtype=torch.bool)
    s = (student[real].float() / temperature).log_softmax(-1)
    t = (teacher[real].float() / temperature).log_softmax(-1)
    soft = (t.exp() * (t - s)).sum()  # Σ_tokens KL(p_t ‖ p_s)
    return LossSums(alpha * hard.loss + (1 - alpha) * temperature**2 * soft, hard.nll,
                    hard.tokens)


def cosine_loss(student: Tensor, teacher: Tensor, mask: Tensor | None = None) -> Tensor:
    """``Σ (1 − cos(h_s, h_t))`` over the positions ``mask`` keeps: ``(..., d)`` each."""
    cos = F.cosine_similarity(student.float(), teacher.float(), dim=-1)
    return ((1 - cos) * (mask if mask is not None else 1)).sum()


def _stack(model: nn.Module) -> nn.Module:
    """The layer stack whose output is the last hidden states (BERT's encoder, GPT's
    blocks)."""
    for name in ("encoder", "blocks"):
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    raise BadInput(f"{type(model).__name__}: no layer stack to take hidden states from")


class Distill:
    """A task: ``task``'s batches, the loss above against ``teacher``."""

    def __init__(self, task, teacher: nn.Module, temperature: float = 2.0, alpha: float = 0.5,
                 hidden_weight: float = 0.0):
        if isinstance(task, Seq2Seq):
            raise BadInput("translation is distilled at sequence level (the teacher's beam "
                           "outputs as targets), not token by token")
        self.task, self.teacher = task, teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.temperature, self.alpha, self.hidden_weight = temperature, alpha, hidden_weight

    def target_tokens(self, batch) -> int:
        return self.task.target_tokens(batch)

    def source_tokens(self, batch) -> int:
        return self.task.source_tokens(batch)

    def __getattr__(self, name: str):
        # a classifying task's ``logits`` (the trainer's accuracy reads them), only when the
        # wrapped task has them
        if name == "logits" and "task" in self.__dict__:
            return getattr(self.task, name)
        raise AttributeError(name)

    def _forward(self, model: nn.Module, batch) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(logits, targets, mask of real positions)`` the wrapped task predicts."""
        if isinstance(self.task, Classify):
            return self.task.logits(model, batch), batch.labels, None
        if isinstance(self.task, CausalLM):
            return model(batch.inputs), batch.targets, None
        raise BadInput(f"no distillation for the task {type(self.task).__name__}")

    def loss(self, model: nn.Module, batch) -> LossSums:
        states: dict[str, Tensor] = {}
        hooks = []
        if self.hidden_weight:
            for name, m in (("student", model), ("teacher", self.teacher)):
                hooks.append(_stack(m).register_forward_hook(
                    lambda mod, args, out, name=name: states.__setitem__(
                        name, out[0] if isinstance(out, tuple) else out)))
        try:
            logits, targets, _ = self._forward(model, batch)
            with torch.no_grad():
                teacher_logits, _, _ = self._forward(self.teacher, batch)
        finally:
            for h in hooks:
                h.remove()
        sums = distillation_loss(logits, teacher_logits, targets, self.temperature, self.alpha)
        if self.hidden_weight:
            mask = getattr(batch, "attention_mask", None)
            hidden = cosine_loss(states["student"], states["teacher"],
                                 None if mask is None else mask.float())
            # the trainer divides by the targets; the cosine term is a mean over positions
            positions = float(mask.sum()) if mask is not None else states["student"][..., 0].numel()
            sums.loss = sums.loss + self.hidden_weight * hidden * sums.tokens / positions
        return sums


def student_config(teacher: ModelConfig, layers: int | None = None,
                   preset: ModelConfig | None = None) -> ModelConfig:
    """The student's config: the teacher's with ``layers`` layers, or a ``preset`` given the
    teacher's vocabulary, ids, head, labels and context."""
    if (layers is None) == (preset is None):
        raise BadInput("give the student as a number of layers or as a preset, one of them")
    if layers is not None:
        fields = {"decoder": ["n_decoder_layers"], "encoder-decoder": [
            "n_encoder_layers", "n_decoder_layers"]}.get(teacher.arch, ["n_encoder_layers"])
        have = min(getattr(teacher, f) for f in fields)
        if not 1 <= layers < have:
            raise BadInput(f"--student-layers {layers}: the teacher has {have} layers; a "
                           f"student has between 1 and {have - 1}")
        return dataclasses.replace(teacher, **dict.fromkeys(fields, layers), pruned_heads={})
    if preset.arch != teacher.arch:
        raise BadInput(f"the student preset is arch={preset.arch!r}, the teacher "
                       f"arch={teacher.arch!r}")
    keep = ("vocab_size", "tgt_vocab_size", "pad_id", "unk_id", "bos_id", "eos_id", "head",
            "num_labels", "extra", "max_len", "block_size", "type_vocab_size")
    return dataclasses.replace(preset, **{k: getattr(teacher, k) for k in keep})


def init_from_teacher(student: nn.Module, teacher: nn.Module) -> list[int]:
    """DistilBERT's initialisation: a student of the teacher's width with N of its L layers
    takes the teacher's layers ``0, L/N, 2L/N, …`` and every other weight (embeddings, norms,
    pooler, heads) as they are. Returns the teacher layers taken."""
    s_layers, t_layers = _stack(student).layers, _stack(teacher).layers
    taken = [k * len(t_layers) // len(s_layers) for k in range(len(s_layers))]
    state = {k: v for k, v in teacher.state_dict().items() if ".layers." not in k}
    for i, j in enumerate(taken):
        s_layers[i].load_state_dict(t_layers[j].state_dict())
    missing, unexpected = student.load_state_dict(state, strict=False)
    if unexpected or any(".layers." not in k for k in missing):
        raise BadInput(f"the teacher's weights do not fit the student (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    return taken


@dataclasses.dataclass
class DistillRecipe(Recipe):
    """The teacher's own recipe for the data (``inner``: a classifier's or a language
    model's), with a student model and the :class:`Distill` task."""

    inner: Recipe
    teacher: nn.Module
    layers: int | None = None
    preset: ModelConfig | None = None
    temperature: float = 2.0
    alpha: float = 0.5
    hidden_weight: float = 0.0

    @property
    def arch(self) -> str:  # type: ignore[override]
        return self.inner.arch

    def prepare(self, model_config, train_config) -> Prepared:
        prepared = self.inner.prepare(model_config, train_config)
        config = student_config(self.teacher.config, self.layers, self.preset)
        if self.hidden_weight and config.d_model != self.teacher.config.d_model:
            raise BadInput(f"--hidden-weight compares hidden states, which needs the student's "
                           f"width to equal the teacher's (d_model {config.d_model} vs "
                           f"{self.teacher.config.d_model})")
        prepared.state.pop("base", None)  # the classifier recipe's encoder: the teacher here
        device = torch.device(train_config.device)
        teacher = self.teacher.to(device)
        return dataclasses.replace(
            prepared, config=config,
            task=Distill(prepared.task, teacher, self.temperature, self.alpha,
                         self.hidden_weight),
            summary=f"{prepared.summary}; distilled at T={self.temperature}, α={self.alpha}"
                    + (f", hidden-state weight {self.hidden_weight}" if self.hidden_weight
                       else ""))

    def build(self, prepared: Prepared) -> nn.Module:
        student = build_model(prepared.config)
        if self.layers is not None:  # state_dict copies cross devices: the teacher stays
            prepared.state["taken"] = init_from_teacher(student, self.teacher)
        return student

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        if isinstance(prepared.task.task, Classify):
            return finish_classifier(model, prepared, out_dir, rank)
        return self.inner.finish(model, prepared, out_dir, rank)


def sequence_level_corpus(teacher: nn.Module, src_tok, tgt_tok, sources: list[str],
                          beam: int = 4, batch_size: int = 64) -> list[tuple[str, str]]:
    """Kim and Rush's data: each source with the teacher's beam-search translation."""
    from attnlab.generation.seq2seq import translate

    outputs = translate(teacher.eval(), src_tok, tgt_tok, sources, batch_size=batch_size,
                        beam_size=beam)
    return [(s, t) for s, t in zip(sources, outputs, strict=True) if t.strip()]


__all__ = ["Distill", "DistillRecipe", "cosine_loss", "distillation_loss", "init_from_teacher",
           "sequence_level_corpus", "student_config"]
