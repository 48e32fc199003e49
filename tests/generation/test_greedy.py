"""Greedy decoding: the cache changes nothing; a model learns to copy."""

import pytest
import torch

from attnlab import ModelConfig, Transformer
from attnlab.data import TranslationBatches
from attnlab.generation import greedy_decode
from attnlab.training import TrainConfig, Trainer
from attnlab.training.objectives import Seq2Seq
from attnlab.training.schedule import NoamSchedule, schedule_to_dict
from tests.criteria import train_until


def test_cached_and_uncached_greedy_are_identical():
    model = Transformer(ModelConfig.from_preset("tiny", dropout=0.0)).eval()
    src = torch.randint(4, 1000, (3, 9))
    src[1, 6:] = 0
    a, la = greedy_decode(model, src, max_len=20, use_cache=True, return_logits=True)
    b, lb = greedy_decode(model, src, max_len=20, use_cache=False, return_logits=True)
    assert torch.equal(a, b)
    assert (la - lb).abs().max() <= 1e-5
    assert a.shape[1] == 20 and (a[:, 0] == 2).all()  # bos first; random weights never stop


def test_copy_task_learns_exact_copies(tmp_path):
    # The Annotated Transformer's sanity check: vocabulary of 11 (4 specials + 7 symbols). It
    # trains until 50 unseen sequences are copied exactly; how many steps that takes depends on
    # the CPU's rounding (500 to 600 here), so the cap is generous and fails loudly.
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(4, 11, (4000, 8), generator=g).tolist()
    src = [s + [3] for s in seqs]
    tgt = [[2] + s + [3] for s in seqs]
    cfg = ModelConfig.from_preset("tiny", vocab_size=11, dropout=0.0, d_model=64, max_len=32)
    model = Transformer(cfg)
    train_cfg = TrainConfig(steps=1, max_tokens=1600, progress=False, save_every=10_000,
                            schedule=schedule_to_dict(NoamSchedule(64, warmup=200, factor=1.0)))
    trainer = Trainer(model, TranslationBatches(src, tgt, 1600, seed=0), train_cfg, tmp_path,
                      {}, cfg, Seq2Seq(cfg.pad_id, train_cfg.label_smoothing))
    test = torch.randint(4, 11, (50, 8), generator=torch.Generator().manual_seed(1))
    test_src = torch.cat([test, torch.full((50, 1), 3)], 1)

    def hundred_steps():
        trainer.cfg.steps = trainer.step + 100
        trainer.fit()

    def copies():
        model.eval()
        out = greedy_decode(model, test_src)
        model.train()
        right = (out[:, 1:9] == test).all(1) & (out[:, 9] == 3)
        return bool(right.all()), f"{int(right.sum())}/50 copied exactly"

    train_until(hundred_steps, copies, "copy task", every=1, cap=20, unit="rounds of 100 steps")


def test_compiled_training_matches_eager(tmp_path):
    """``TrainConfig(compile=True)`` runs the same steps as eager mode (to float tolerance)."""
    seqs = torch.randint(4, 11, (64, 6), generator=torch.Generator().manual_seed(2)).tolist()
    src, tgt = [s + [3] for s in seqs], [[2] + s + [3] for s in seqs]
    cfg = ModelConfig.from_preset("tiny", vocab_size=11, dropout=0.0, max_len=16)
    runs = []
    for compile_ in (False, True):
        torch.manual_seed(0)
        model = Transformer(cfg)
        train_cfg = TrainConfig(steps=3, max_tokens=256, progress=False, save_every=10_000,
                                compile=compile_)
        hist = Trainer(model, TranslationBatches(src, tgt, 256, seed=0), train_cfg,
                       tmp_path / str(compile_), {}, cfg,
                       Seq2Seq(cfg.pad_id, train_cfg.label_smoothing)).fit()
        runs.append([h["loss"] for h in hist])
    assert runs[0] == pytest.approx(runs[1], rel=1e-4)
