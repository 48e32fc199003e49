"""Distillation: the loss equals its formula on a case worked by hand, and the student is
initialised from the teacher's layers as documented."""

import math

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.errors import BadInput
from attnlab.training.distill import (
    cosine_loss,
    distillation_loss,
    init_from_teacher,
    student_config,
)


def test_distillation_loss_worked_by_hand():
    student = torch.tensor([[2.0, 0.0, -2.0]])
    teacher = torch.tensor([[1.0, 1.0, 0.0]])
    target = torch.tensor([1])
    T, alpha = 2.0, 0.3
    # hard: −log softmax(student)[1] = log(e² + 1 + e⁻²) − 0
    hard = math.log(math.exp(2) + 1 + math.exp(-2))
    # soft at T = 2: p_s ∝ (e¹, e⁰, e⁻¹), p_t ∝ (e^0.5, e^0.5, 1)
    zs = math.e + 1 + 1 / math.e
    ps = [math.e / zs, 1 / zs, (1 / math.e) / zs]
    zt = 2 * math.exp(0.5) + 1
    pt = [math.exp(0.5) / zt, math.exp(0.5) / zt, 1 / zt]
    kl = sum(t * math.log(t / s) for t, s in zip(pt, ps, strict=True))
    sums = distillation_loss(student, teacher, target, T, alpha)
    assert sums.tokens == 1
    assert sums.nll.item() == pytest.approx(hard, rel=1e-6)
    assert sums.loss.item() == pytest.approx(alpha * hard + (1 - alpha) * T**2 * kl, rel=1e-6)


def test_distillation_loss_edges():
    s, t = torch.randn(4, 5, 7), torch.randn(4, 5, 7)
    y = torch.randint(0, 7, (4, 5))
    hard = distillation_loss(s, t, y, 3.0, 1.0)
    assert hard.loss.item() == pytest.approx(hard.nll.item(), rel=1e-6)  # α = 1: CE only
    same = distillation_loss(s, s, y, 3.0, 0.0)
    assert abs(same.loss.item()) < 1e-5  # KL(p ‖ p) = 0
    y[0, :2] = 0
    padded = distillation_loss(s, t, y, 2.0, 0.5, pad_id=0)
    assert padded.tokens == int((y != 0).sum())
    for T, alpha in ((0.0, 0.5), (1.0, 1.5)):
        with pytest.raises(BadInput, match="temperature > 0 and 0 <= alpha <= 1"):
            distillation_loss(s, t, y, T, alpha)


def test_cosine_loss_by_hand():
    a = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    b = torch.tensor([[[0.0, 1.0], [2.0, 2.0]]])
    assert cosine_loss(a, b).item() == pytest.approx(1.0)  # 1 − 0 and 1 − 1
    assert cosine_loss(a, b, torch.tensor([[0.0, 1.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_students_take_evenly_spaced_teacher_layers():
    teacher_config = ModelConfig.from_preset("bert-mini", vocab_size=30, n_encoder_layers=6,
                                             d_model=32, n_heads=2, d_ff=64, head="classify")
    torch.manual_seed(0)
    teacher = build_model(teacher_config)
    config = student_config(teacher_config, layers=2)
    assert config.n_encoder_layers == 2 and config.head == "classify"
    student = build_model(config)
    assert init_from_teacher(student, teacher) == [0, 3]
    for i, j in ((0, 0), (1, 3)):
        for (n, p), (_, q) in zip(student.encoder.layers[i].state_dict().items(),
                                  teacher.encoder.layers[j].state_dict().items(), strict=True):
            assert torch.equal(p, q), n
    assert torch.equal(student.classifier.weight, teacher.classifier.weight)
    with pytest.raises(BadInput, match="between 1 and 5"):
        student_config(teacher_config, layers=6)
