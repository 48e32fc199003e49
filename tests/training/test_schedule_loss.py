import math
import re

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from attnlab.training import CosineSchedule, NoamSchedule, label_smoothed_loss, smoothed_target
from attnlab.training.schedule import ConstantSchedule, LinearSchedule, PolynomialSchedule
from attnlab.training.trainer import TrainConfig


def test_noam_schedule_matches_the_formula():
    s = NoamSchedule(d_model=512, warmup=4000)
    for step in (1, 4000, 8000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert math.isclose(s(step), expected, rel_tol=1e-12)
    assert abs(s(4000) - 6.988e-4) < 5e-8  # the peak
    assert s(1) < s(2000) < s(4000) > s(8000)
    assert math.isclose(s(8000), 512**-0.5 * 8000**-0.5)


def test_cosine_schedule_by_hand():
    """Step k uses λ(k − 1), as transformers' LambdaLR: warmup 10 of 110 steps, 1e-3 to 1e-4."""
    s = CosineSchedule(peak_lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4)
    assert s(1) == 0.0 and math.isclose(s(6), 5e-4) and math.isclose(s(11), 1e-3)
    assert math.isclose(s(61), 1e-4 + 0.5 * 9e-4) and math.isclose(s(111), 1e-4)


def test_noam_given_a_peak_reaches_it_at_the_end_of_warmup():
    s = NoamSchedule.with_peak(3e-4, warmup=400, d_model=64)
    assert math.isclose(s(400), 3e-4, rel_tol=1e-12) and math.isclose(s.peak_lr, 3e-4)
    assert max(s(k) for k in range(1, 2000)) == s(400)


def _transformers_rates(kind: str, peak: float, warmup: int, total: int, **kw) -> list[float]:
    """The rate transformers' scheduler gives optimizer step k = 1..total: the one in the
    optimizer when ``step()`` runs (its LambdaLR starts at λ(0) and steps after the
    optimizer)."""
    import transformers

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=peak)
    make = {"cosine": transformers.get_cosine_schedule_with_warmup,
            "cosine_min": transformers.get_cosine_with_min_lr_schedule_with_warmup,
            "linear": transformers.get_linear_schedule_with_warmup,
            "polynomial": transformers.get_polynomial_decay_schedule_with_warmup,
            "constant": transformers.get_constant_schedule_with_warmup}[kind]
    args = (warmup,) if kind == "constant" else (warmup, total)
    scheduler = make(opt, *args, **kw)
    rates = []
    for _ in range(total):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return rates


def _attnlab_rates(tmp_path, schedule, total: int) -> list[float]:
    """The rate attnlab's trainer gives optimizer step k = 1..total, read from the optimizer
    as each step runs (a tiny GPT on a tiny text)."""
    from attnlab import ModelConfig
    from attnlab.training.recipes import LMRecipe, run
    from attnlab.training.schedule import schedule_to_dict

    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 20)
    rates = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: rates.append(opt.param_groups[0]["lr"]))
    try:
        run(LMRecipe(text, 8, 2), tmp_path / "run",
            ModelConfig.from_preset("gpt-mini", d_model=16, n_heads=2, d_ff=32,
                                    n_decoder_layers=1),
            TrainConfig(steps=total, schedule=schedule_to_dict(schedule), progress=False,
                        device="cpu", optimizer="adamw", save_every=1000),
            log=lambda *a: None)
    finally:
        hook.remove()
    return rates


TOTAL = 14


@pytest.mark.parametrize("schedule, kind, kw", [
    (CosineSchedule(2e-3, 4, TOTAL), "cosine", {}),
    (CosineSchedule(2e-3, 0, TOTAL), "cosine", {}),
    (CosineSchedule(2e-3, 4, TOTAL, min_lr=3e-4), "cosine_min", {"min_lr": 3e-4}),
    (LinearSchedule(2e-3, 4, TOTAL), "linear", {}),
    (PolynomialSchedule(2e-3, 3, TOTAL, lr_end=1e-4, power=2.0), "polynomial",
     {"lr_end": 1e-4, "power": 2.0}),
    (PolynomialSchedule(2e-3, 3, TOTAL), "polynomial", {}),
    (ConstantSchedule(2e-3, 5), "constant", {}),
], ids=["cosine", "cosine-no-warmup", "cosine-min-lr", "linear", "polynomial-power-2",
        "polynomial-defaults", "constant"])
def test_each_step_takes_the_rate_transformers_gives_it(tmp_path, schedule, kind, kw):
    ours = _attnlab_rates(tmp_path, schedule, TOTAL)
    theirs = _transformers_rates(kind, 2e-3, schedule.warmup, TOTAL, **kw)
    assert len(ours) == len(theirs) == TOTAL
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18), (k, a, b)
    assert max(ours) == pytest.approx(2e-3)  # (the peak is reached: not a trivial match)


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
    (lambda: PolynomialSchedule(peak_lr=1e-4, lr_end=1e-3), "lr_end 0.001 must be below"),
    (lambda: PolynomialSchedule(power=-1.0), "power must be >= 0"),
    (lambda: CosineSchedule(peak_lr=1e-4, min_lr=1e-3), "min_lr 0.001 must not exceed"),
    (lambda: NoamSchedule.with_peak(0.0, 10, 64), "peak_lr must be > 0"),
    (lambda: TrainConfig(steps=0), "steps must be >= 1, got 0"),
    (lambda: TrainConfig(accumulate=0), "accumulate must be >= 1, got 0"),
    (lambda: TrainConfig(label_smoothing=1.0), "label_smoothing must be < 1"),
    (lambda: TrainConfig(time_budget=0.0), "time_budget must be > 0"),
])
def test_bad_settings_name_the_field(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
