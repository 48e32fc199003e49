"""Training worked by hand: gradient descent on x² (the mathematics text), label smoothing
and the learning-rate schedule (the guide), and the teacher-forced loss (the network text).
Checked against torch.optim, torch's cross-entropy and attnlab's own loss and schedule.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlab.explain.examples.base import ExampleResult, diff, tensor
from attnlab.training.loss import label_smoothed_loss, smoothed_target
from attnlab.training.schedule import NoamSchedule

CLASSES = [f"class {c}" for c in range(5)]
STEPS = [2000, 4000, 6000, 8000, 10000]


def gradient_descent(r: ExampleResult) -> None:
    """x ← x − α·f'(x) with f(x) = x², f'(x) = 2x, x₀ = 3, α = 0.1: x_k = 3·(1 − 2α)^k."""
    xs = [3.0]
    for _ in range(11):
        xs.append(xs[-1] - 0.1 * 2 * xs[-1])
    x = r.step("x_k, k = 0..11", "x_{k+1} = x_k − 0.1·2·x_k", xs)
    f = r.step("f(x_k)", "x_k²", x**2)
    r.compare("x_0, x_1, x_2, x_3", "[3.0, 2.4, 1.92, 1.54]", x[:4])
    r.compare("f(x_0), f(x_1), f(x_2)", "[9.0, 5.76, 3.69]", f[:3])
    r.compare("x_10, f(x_10)", "[0.27, 0.07]", torch.stack([x[10], f[10]]),
              why="each step multiplies x by 1 − 2·0.1 = 0.8, so x_10 = 3·0.8^10 = 0.322 and "
                  "f = 0.104; the text's 0.27 is no iterate (x_11 = 0.258)")
    p = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    sgd = torch.optim.SGD([p], lr=0.1)
    seen = [3.0]
    for _ in range(11):
        sgd.zero_grad()
        (p**2).backward()
        sgd.step()
        seen.append(float(p.detach()))
    r.check("x_k vs torch.optim.SGD on x²", diff(x, seen), 1e-12)
    r.check("x_k vs the closed form 3·0.8^k", diff(x, [3 * 0.8**k for k in range(12)]), 1e-12)


def label_smoothing(r: ExampleResult) -> None:
    """q = (1 − ε)·one_hot(y) + ε/K with K = 5 classes, ε = 0.1, the true class 2."""
    eps, k, y = 0.1, 5, 2
    one_hot = r.step("one-hot target", "all on the true class", F.one_hot(torch.tensor(y), k),
                     cols=CLASSES)
    q = r.step("smoothed target q", "(1 − ε)·one-hot + ε/K", (1 - eps) * one_hot + eps / k,
               cols=CLASSES)
    r.compare("smoothed target q", "[0.02, 0.02, 0.92, 0.02, 0.02]", q)
    g = torch.Generator().manual_seed(0)
    logits = r.step("logits (not stated: seed 0)", "a model's scores, to show the loss",
                    torch.randn(k, generator=g, dtype=torch.float64), cols=CLASSES)
    log_p = r.step("log p", "log softmax(logits)", torch.log_softmax(logits, -1), cols=CLASSES)
    loss = r.step("loss", "−Σ_c q(c)·log p(c)", -(q * log_p).sum())
    r.step("plain cross-entropy", "−log p(y), for comparison", -log_p[y])
    target = torch.tensor([y])
    r.check("loss vs torch cross_entropy(label_smoothing=0.1)",
            diff(loss, F.cross_entropy(logits[None], target, label_smoothing=eps)), 1e-12)
    own = label_smoothed_loss(logits[None, None], target[None], epsilon=eps, pad_id=None)
    r.check("loss vs attnlab.training.loss.label_smoothed_loss (pad_id=None)",
            diff(loss, own.loss), 1e-6)  # attnlab's loss runs in float32
    # attnlab's target with a padding class spreads ε over the K = V − 1 real classes.
    r.check("q vs attnlab's smoothed_target (5 real classes and a padding class)",
            diff(q, smoothed_target(target, k + 1, eps, pad_id=k)[0, :k]), 1e-6)


def lr_peak(r: ExampleResult) -> None:
    """lr(t) = d^−0.5 · min(t^−0.5, t·w^−1.5), d = 512, w = 4000: it peaks at t = w."""
    d, warmup = 512, 4000
    peak = r.step("peak lr", "d^−0.5 · w^−0.5 = 1/√(512·4000)", d**-0.5 * warmup**-0.5)
    lr = r.step("lr(t), t = 2K..10K", "the schedule",
                [d**-0.5 * min(t**-0.5, t * warmup**-1.5) for t in STEPS],
                cols=[f"{t // 1000}K" for t in STEPS])
    relative = r.step("lr(t) / peak", "as a fraction of the peak", lr / peak,
                      cols=[f"{t // 1000}K" for t in STEPS])
    r.compare("lr(t) / peak at 2K, 4K, 6K, 8K, 10K", "[0.7, 1.0, 0.8, 0.7, 0.6]", relative,
              why="warm-up is linear: lr(2000) = 2000/4000 of the peak = 0.5; 0.7 = √0.5 is "
                  "the decay's value at 8K, not the warm-up's at 2K")
    r.note(f"the peak, {float(peak):.3e}, is reached at step {warmup}; the BERT/GPT text's "
           "warm-up and decay (η·t/w, η·√(w/t)) are the same curve with η = the peak")
    noam = NoamSchedule(d_model=d, warmup=warmup)
    r.check("lr(t) vs attnlab.training.schedule.NoamSchedule", diff(lr, [noam(t) for t in
                                                                          STEPS]), 1e-15)
    best = max(range(1, 20001), key=noam)
    r.check("NoamSchedule's largest value is at step 4000", abs(best - warmup), 0)
    r.check("NoamSchedule(4000) vs the peak", abs(noam(warmup) - float(peak)), 1e-15)


def sequence_loss(r: ExampleResult) -> None:
    """Teacher forcing: the loss is −Σ_t log p(y_t), one term per target position."""
    tokens = ["Je", "t'", "aime", "<E>"]
    p = r.step("p(y_t) (given)", "the model's probability of each correct token",
               [0.8, 0.7, 0.9, 0.85], cols=tokens)
    terms = r.step("−log p(y_t)", "natural logarithm", -torch.log(p), cols=tokens)
    r.compare("−log p(y_t)", "[0.22, 0.36, 0.11, 0.16]", terms)
    total = r.step("loss", "Σ_t −log p(y_t)", terms.sum())
    r.compare("loss", "0.85", total)
    r.note(f"attnlab reports the mean over tokens, {float(total) / 4:.4f}, and perplexity "
           f"e^mean = {math.exp(float(total) / 4):.4f}")
    log_p = torch.log(torch.stack([p, 1 - p], -1))  # a 2-way distribution per position
    r.check("loss vs torch nll_loss (sum)", diff(total, F.nll_loss(
        log_p, torch.zeros(4, dtype=torch.long), reduction="sum")), 1e-12)
    r.check("loss vs −log Π p(y_t)", diff(total, -torch.log(tensor(p).prod())), 1e-12)
