"""Training precision: bf16 autocast and fp16 with dynamic loss scaling follow the fp32
trajectory to their rounding; the scaler's state is checkpointed; the old flags still work,
with a one-line deprecation warning."""

import pytest
import torch

from attnlab import ModelConfig, Transformer
from attnlab.cli import main
from attnlab.data import TranslationBatches
from attnlab.training import TrainConfig, Trainer
from attnlab.training.checkpoint import list_checkpoints, load_trainer_state
from attnlab.training.objectives import Seq2Seq
from attnlab.training.schedule import CosineSchedule, schedule_to_dict


def train(precision, out, steps=6):
    """Six steps at a real learning rate with the gradient clipped to norm 0.5 (the random
    model's gradients are larger, so clipping acts on every step)."""
    seqs = torch.randint(4, 11, (256, 6), generator=torch.Generator().manual_seed(2)).tolist()
    src, tgt = [s + [3] for s in seqs], [[2] + s + [3] for s in seqs]
    cfg = ModelConfig.from_preset("tiny", vocab_size=11, dropout=0.0, max_len=16)
    torch.manual_seed(0)
    model = Transformer(cfg)
    schedule = schedule_to_dict(CosineSchedule(peak_lr=3e-3, warmup=0, total_steps=100))
    trainer = Trainer(model, TranslationBatches(src, tgt, 256, seed=0),
                      TrainConfig(steps=steps, max_tokens=256, progress=False, save_every=3,
                                  precision=precision, schedule=schedule, clip_norm=0.5),
                      out, {}, cfg, Seq2Seq(cfg.pad_id, 0.1))
    history = trainer.fit()
    return [h["loss"] for h in history], [h["grad_norm"] for h in history], trainer


@pytest.mark.parametrize("precision, rel", [("bf16", 3e-2), ("fp16", 1e-2)])
def test_mixed_precision_follows_fp32(tmp_path, precision, rel):
    """Same losses and the same (pre-clipping) gradient norms as fp32, to the half type's
    rounding: with fp16, a gradient clipped before the loss scale is divided out would be
    2^15 times too large, and the steps would differ."""
    losses32, norms32, _ = train("fp32", tmp_path / "fp32")
    losses, norms, trainer = train(precision, tmp_path / precision)
    assert min(norms32) > 0.5  # clipping was active (1.2 at least, both CPUs)
    assert losses != losses32  # it did run in lower precision
    assert losses == pytest.approx(losses32, rel=rel)
    assert norms == pytest.approx(norms32, rel=rel)
    assert losses[-1] < 0.9 * losses[0]  # and it learned (0.735 natively and with AVX2 emulated)
    if precision == "fp16":  # the scaler's state is checkpointed for an exact resume
        state = load_trainer_state(list_checkpoints(tmp_path / "fp16" / "checkpoints")[-1])
        assert state["scaler"]["scale"] == trainer.scaler.get_scale()


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
