"""Training precision: bf16 autocast and fp16 with dynamic loss scaling follow the fp32
trajectory to their rounding; the scaler's state is checkpointed; the old flags still work,
with a one-line deprecation warning."""

from dataclasses import replace

import pytest
import torch

from attnlab import ModelConfig, Transformer
from attnlab.cli import main
from attnlab.data import TranslationBatches
from attnlab.training import TrainConfig, Trainer
from attnlab.training.checkpoint import list_checkpoints, load_trainer_state
from attnlab.training.objectives import Seq2Seq
from attnlab.training.schedule import CosineSchedule, schedule_to_dict
from tests.criteria import train_until


def trainer(precision, out):
    """A tiny translator's trainer at a real learning rate with the gradient clipped to norm
    0.5 (the random model's gradients are larger, so clipping acts on every step)."""
    seqs = torch.randint(4, 11, (256, 6), generator=torch.Generator().manual_seed(2)).tolist()
    src, tgt = [s + [3] for s in seqs], [[2] + s + [3] for s in seqs]
    cfg = ModelConfig.from_preset("tiny", vocab_size=11, dropout=0.0, max_len=16)
    torch.manual_seed(0)
    model = Transformer(cfg)
    schedule = schedule_to_dict(CosineSchedule(peak_lr=3e-3, warmup=0, total_steps=100))
    return Trainer(model, TranslationBatches(src, tgt, 256, seed=0),
                   TrainConfig(steps=1, max_tokens=256, progress=False, save_every=3,
                               precision=precision, schedule=schedule, clip_norm=0.5),
                   out, {}, cfg, Seq2Seq(cfg.pad_id, 0.1))


def train_to(trainer, steps):
    """Train on to ``steps`` (the schedule does not depend on it); the rows of those steps."""
    trainer.cfg = replace(trainer.cfg, steps=steps)
    return trainer.fit()


def losses_and_norms(history):
    return [h["loss"] for h in history], [h["grad_norm"] for h in history]


@pytest.mark.parametrize("precision, rel", [("bf16", 3e-2), ("fp16", 1e-2)])
def test_mixed_precision_follows_fp32(tmp_path, precision, rel):
    """Same losses and the same (pre-clipping) gradient norms as fp32, to the half type's
    rounding: with fp16, a gradient clipped before the loss scale is divided out would be
    2^15 times too large, and the steps would differ. fp32 trains in rounds of 6 steps until
    it has learned (the last loss below 0.9 × the first: 0.735 after 6 steps natively and
    with AVX2 emulated), so the trajectories compared are ones that learn; a broken
    optimiser step fails at the cap, naming the losses."""
    fp32 = trainer("fp32", tmp_path / "fp32")
    history = []

    def six_steps():
        history.extend(train_to(fp32, fp32.step + 6))

    def learned():
        first, last = history[0]["loss"], history[-1]["loss"]
        return last < 0.9 * first, f"loss {first:.3f} at step 1, {last:.3f} at {fp32.step}"

    train_until(six_steps, learned, "fp32 training", every=1, cap=8, unit="rounds of 6 steps")
    losses32, norms32 = losses_and_norms(history)
    half = trainer(precision, tmp_path / precision)
    losses, norms = losses_and_norms(train_to(half, fp32.step))
    assert min(norms32) > 0.5  # clipping was active (1.2 at least, both CPUs)
    assert losses != losses32  # it did run in lower precision
    assert losses == pytest.approx(losses32, rel=rel)
    assert norms == pytest.approx(norms32, rel=rel)
    if precision == "fp16":  # the scaler's state is checkpointed for an exact resume
        state = load_trainer_state(list_checkpoints(tmp_path / "fp16" / "checkpoints")[-1])
        assert state["scaler"]["scale"] == half.scaler.get_scale()


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="precision 'fp8': expected one of auto, fp32"):
        TrainConfig(precision="fp8")


def test_old_flags_warn_once_and_still_work(tmp_path, capsys):
    args = ["train", "translate", "--task", "numbers", "--n-train", "300", "--steps", "1",
            "--out", str(tmp_path / "run"), "--no-progress", "--no-evaluate", "--device", "cpu"]
    assert main([*args, "--bf16"]) == 0
    captured = capsys.readouterr()
    assert ("attnlab: warning: --bf16 is deprecated and goes in the next release; use "
            "--precision bf16") in captured.err
    assert "device cpu, precision bf16" in captured.out
    assert main([*args, "--bf16", "--precision", "fp32", "--resume"]) == 2
    assert "--bf16 contradicts --precision fp32" in capsys.readouterr().err


def test_training_commands_say_what_auto_chose(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", "0")
    monkeypatch.delenv("ATTNLAB_PRECISION", raising=False)
    assert main(["train", "translate", "--task", "numbers", "--n-train", "300", "--steps", "1",
                 "--out", str(tmp_path / "run"), "--no-progress", "--no-evaluate",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "device cpu, precision fp32 (auto: forced by ATTNLAB_NATIVE_BF16=0)" in out
