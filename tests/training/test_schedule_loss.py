import math
import re

import pytest
import torch

from attnlab.training import CosineSchedule, NoamSchedule, label_smoothed_loss, smoothed_target
from attnlab.training.schedule import LinearSchedule
from attnlab.training.trainer import TrainConfig


def test_noam_schedule_matches_the_formula():
    s = NoamSchedule(d_model=512, warmup=4000)
    for step in (1, 4000, 8000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert math.isclose(s(step), expected, rel_tol=1e-12)
    assert abs(s(4000) - 6.988e-4) < 5e-8  # the peak
    assert s(1) < s(2000) < s(4000) > s(8000)
    assert math.isclose(s(8000), 512**-0.5 * 8000**-0.5)


def test_cosine_schedule():
    s = CosineSchedule(peak_lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4)
    assert math.isclose(s(5), 5e-4) and math.isclose(s(10), 1e-3)
    assert math.isclose(s(60), 1e-4 + 0.5 * 9e-4) and math.isclose(s(110), 1e-4)


def test_label_smoothing_distribution_over_five_classes():
    # 6 ids = pad + 5 real classes; ε = 0.1: 0.9 + 0.1/5 on the target, 0.1/5 on the others,
    # nothing on pad (pad is kept out of the smoothing mass entirely).
    q = smoothed_target(torch.tensor([2]), vocab_size=6, epsilon=0.1, pad_id=0)[0]
    assert torch.allclose(q, torch.tensor([0.0, 0.02, 0.92, 0.02, 0.02, 0.02]))
    assert math.isclose(q.sum().item(), 1.0, rel_tol=1e-6)


def test_label_smoothed_loss_equals_dense_cross_entropy_and_skips_padding():
    logits = torch.randn(2, 4, 6)
    target = torch.tensor([[2, 5, 1, 0], [3, 0, 0, 0]])
    sums = label_smoothed_loss(logits, target, epsilon=0.1, pad_id=0)
    real = target != 0
    q = smoothed_target(target, 6, 0.1, 0)
    dense = -(q * logits.log_softmax(-1)).sum(-1)
    assert sums.tokens == 4
    assert torch.allclose(sums.loss, dense[real].sum(), atol=1e-5)
    nll = torch.nn.functional.cross_entropy(logits[real], target[real], reduction="sum")
    assert torch.allclose(sums.nll, nll, atol=1e-5)
    # changing logits at padded positions changes nothing
    logits2 = logits.clone()
    logits2[~real] = 100.0
    same = label_smoothed_loss(logits2, target).loss
    assert torch.equal(same, label_smoothed_loss(logits, target).loss)


@pytest.mark.parametrize("make, message", [
    (lambda: CosineSchedule(peak_lr=0.0), "peak_lr must be > 0, got 0.0"),
    (lambda: CosineSchedule(warmup=-1), "warmup must be >= 0, got -1"),
    (lambda: CosineSchedule(total_steps=0), "total_steps must be >= 1, got 0"),
    (lambda: NoamSchedule(factor=-1.0), "factor must be > 0"),
    (lambda: NoamSchedule(warmup=0), "warmup must be >= 1, got 0"),
    (lambda: LinearSchedule(peak_lr=float("nan")), "peak_lr must be > 0, got nan"),
    (lambda: TrainConfig(steps=0), "steps must be >= 1, got 0"),
    (lambda: TrainConfig(accumulate=0), "accumulate must be >= 1, got 0"),
    (lambda: TrainConfig(label_smoothing=1.0), "label_smoothing must be < 1"),
    (lambda: TrainConfig(time_budget=0.0), "time_budget must be > 0"),
])
def test_bad_settings_name_the_field(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
