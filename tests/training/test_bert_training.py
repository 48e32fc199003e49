"""BERT training: the masked-LM loss, pretraining that learns, and the classifiers' metrics.
(Fine-tuning a classifier: tests/tasks/test_classify.py.)"""

import math
import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attnlab import BERT, ModelConfig
from attnlab.data import LabelledBatch
from attnlab.data.mlm import MLMBatches
from attnlab.tokenizers import WordPieceTokenizer
from attnlab.training.objectives import MaskedLM, classification_metrics
from attnlab.training.recipes import train_mlm
from attnlab.training.schedule import LinearSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig
from tests.criteria import train_until


def config(steps, lr, **kw):
    return TrainConfig(steps=steps, label_smoothing=0.0, optimizer="adamw", weight_decay=0.01,
                       betas=(0.9, 0.999), eps=1e-6, progress=False, save_every=10_000,
                       schedule=schedule_to_dict(LinearSchedule(lr, steps // 10, steps)), **kw)


def test_masked_lm_loss_is_cross_entropy_at_selected_positions(tmp_path):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tmp_path / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i in range(60)]))
    tok = WordPieceTokenizer.from_file(tmp_path / "vocab.txt")
    sentences = [[5 + (i * 7 + j) % 60 for j in range(i % 5 + 2)] for i in range(40)]
    batch = MLMBatches(sentences, tok, 24, 6, seed=2, nsp=True).batch(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size,
                                         head="pretraining")).eval()
    sums = MaskedLM().loss(model, batch)
    ids, types, attention, labels, nsp = batch
    mlm_logits, nsp_logits = model(ids, types, attention)  # every position, then select
    selected = labels != -100
    mlm = F.cross_entropy(mlm_logits[selected], labels[selected], reduction="sum")
    assert sums.tokens == int(selected.sum()) > 0
    assert torch.allclose(sums.nll, mlm, atol=1e-4)
    expected = mlm + F.cross_entropy(nsp_logits, nsp) * sums.tokens
    assert torch.allclose(sums.loss, expected, atol=1e-4)


def test_mlm_pretraining_learns(tmp_path):
    # Each sentence is 6 consecutive words of a fixed cycle of 30: a masked word is fully
    # determined by its neighbours, so a model that uses context gets far below chance.
    cycle = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike " \
            "november oscar papa quebec romeo sierra tango uniform victor whiskey xray " \
            "yankee zulu red green blue black".split()
    rng = random.Random(0)
    starts = [rng.randrange(30) for _ in range(800)]
    text = "\n".join(" ".join(cycle[(k + j) % 30] for j in range(6)) for k in starts)
    (tmp_path / "corpus.txt").write_text(text)
    # Rounds of 100 steps, resumed, until the validation loss is far below guessing among the
    # vocabulary (below 0.3 × log 100 = 1.38: 2.94, 1.85, 1.00 at steps 100-300 natively);
    # the schedule spans the cap, so it does not depend on when that is.
    cap, rounds = 800, []
    settings = dict(model_config=ModelConfig.from_preset("bert-tiny", dropout=0.0),
                    max_len=32, batch_size=32, vocab_size=100, log=lambda *a: None)

    def hundred_steps():
        steps = 100 * (len(rounds) + 1)
        train_config = replace(config(cap, 2e-3, eval_every=100), steps=steps)
        rounds.append(train_mlm(tmp_path / "corpus.txt", tmp_path / "run",
                                train_config=train_config, resume=bool(rounds), **settings))

    def far_below_guessing():
        _, tok, history = rounds[-1]
        val, uniform = history[-1]["val_loss"], math.log(tok.vocab_size)
        return val < 0.3 * uniform, f"validation masked-LM loss {val:.3f}, uniform {uniform:.3f}"

    train_until(hundred_steps, far_below_guessing, "masked-LM pretraining", every=1,
                cap=cap // 100, unit="rounds of 100 steps")
    assert (tmp_path / "run" / "checkpoints").exists()


def test_metrics_equal_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")

    class Fixed(torch.nn.Module):  # returns given logits, so the predictions are known
        def __init__(self, logits):
            super().__init__()
            self.logits, self.w = logits, torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids, types, attention):
            return self.logits[ids[:, 0]]

    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(50, 3, generator=g), torch.randint(0, 3, (50,), generator=g)
    batches = [LabelledBatch(torch.arange(i, i + 10)[:, None], torch.zeros(10, 1),
                             torch.ones(10, 1), labels[i : i + 10]) for i in range(0, 50, 10)]
    got = classification_metrics(Fixed(logits), batches, torch.device("cpu"), 3)
    pred = logits.argmax(-1).numpy()
    assert got["accuracy"] == pytest.approx(metrics.accuracy_score(labels.numpy(), pred))
    assert got["macro_f1"] == pytest.approx(metrics.f1_score(labels.numpy(), pred,
                                                             average="macro"))
