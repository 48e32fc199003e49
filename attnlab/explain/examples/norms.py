"""Normalisation worked by hand: LayerNorm of [2, 4, 6, 8] (the guide and the network text)
and of "Hi" (the first text); BatchNorm of one neuron's batch and of a batch × neurons table
(the first text), then the same table under LayerNorm.

    BatchNorm:  per feature (a column), over the batch:  ŷ = (x − μ_B) / √(σ_B² + ε)
    LayerNorm:  per example (a row), over its features: ŷ = (x − μ) / √(σ² + ε)
    both then y = γ·ŷ + β;  σ² is the biased variance (divide by the count), ε = 10⁻⁵
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.explain.examples.base import ExampleResult, diff, layer_norm_rows
from attnlab.nn import LayerNorm

SAMPLES = [f"sample {i}" for i in range(1, 6)]
NEURONS = ["z₁", "z₂", "z₃"]
TABLE = [[7, 5, 4], [2, 3, 4], [1, 2, 3], [7, 5, 6], [3, 3, 4]]


def layer_norm(r: ExampleResult) -> None:
    x = r.step("x (given)", "one token's features", [2, 4, 6, 8])
    mu = r.step("μ", "mean of the features", x.mean())
    r.compare("μ", "5", mu)
    var = r.step("σ²", "mean of (x − μ)² (biased)", ((x - mu) ** 2).mean())
    r.compare("σ²", "5.0", var)
    sigma = r.step("σ", "√σ²", var.sqrt())
    r.compare("σ", "2.236", sigma)
    y = r.step("LayerNorm(x)", "(x − μ)/√(σ² + ε), γ = 1, β = 0", layer_norm_rows(x[None])[0])
    r.compare("LayerNorm(x)", "[-1.34, -0.45, 0.45, 1.34]", y)
    hi = r.step("\"Hi\" (given)", "the first text's token, d = 4", [0.2, 0.4, 0.6, 0.8])
    r.compare("σ² of \"Hi\"", "0.05", r.step("σ² of \"Hi\"", "biased", hi.var(unbiased=False)))
    y_hi = r.step("LayerNorm(\"Hi\")", "same formula", layer_norm_rows(hi[None])[0])
    r.compare("LayerNorm(\"Hi\")", "[-1.34, -0.45, 0.45, 1.34]", y_hi)
    r.note("the guide divides by σ alone; torch and attnlab add ε = 1e-5 inside the root, "
           f"which moves the result by {diff(y, (x - mu) / sigma):.1e}")
    ref = nn.LayerNorm(4).double()
    own = LayerNorm(4).double()
    with torch.no_grad():
        r.check("LayerNorm(x) vs torch.nn.LayerNorm(4)", diff(y, ref(x)), 1e-12)
        r.check("LayerNorm(x) vs attnlab.nn.LayerNorm(4)", diff(y, own(x)), 1e-12)
        r.check("LayerNorm(\"Hi\") vs torch.nn.LayerNorm(4)", diff(y_hi, ref(hi)), 1e-12)


def batch_norm(r: ExampleResult) -> None:
    x = r.step("x (given)", "one neuron's activations over a batch of 4", [7, 2, 5, 4])
    mu = r.step("μ_B", "batch mean", x.mean())
    r.compare("μ_B", "4.5", mu)
    var = r.step("σ_B²", "batch variance, biased (÷ 4)", ((x - mu) ** 2).mean())
    r.compare("σ_B²", "3.25", var)
    x_hat = r.step("x̂", "(x − μ_B)/√(σ_B² + ε)", (x - mu) / torch.sqrt(var + 1e-5))
    r.compare("x̂", "[1.39, -1.39, 0.28, -0.28]", x_hat)
    y = r.step("y", "γ·x̂ + β, γ = 0.5, β = 0.1", 0.5 * x_hat + 0.1)
    r.compare("y", "[0.795, -0.595, 0.24, -0.04]", y,
              why="the text scales its 2-decimal x̂: 0.5·1.39 + 0.1 = 0.795; with "
                  "x̂ = 1.3868 it is 0.7934")
    bn = nn.BatchNorm1d(1).double().train()
    with torch.no_grad():
        bn.weight.fill_(0.5)
        bn.bias.fill_(0.1)
        ref = bn(x[:, None])[:, 0]
    r.check("y vs torch.nn.BatchNorm1d (training mode)", diff(y, ref), 1e-12)
    unbiased = float(x.var(unbiased=True))
    r.note(f"in training BatchNorm normalises with the biased σ² = 3.25; the running "
           f"variance it keeps for inference is updated with the unbiased {unbiased:.4f}")
    r.check("BatchNorm1d's running variance uses the unbiased estimate (momentum 0.1)",
            abs(float(bn.running_var[0]) - (0.9 + 0.1 * unbiased)), 1e-12)


def batch_vs_layer_norm(r: ExampleResult) -> None:
    z = r.step("Z (given)", "pre-activations: 5 examples (rows) × 3 neurons (columns)",
               TABLE, SAMPLES, NEURONS)
    mu = r.step("BatchNorm μ", "per column (neuron), over the batch", z.mean(0), cols=NEURONS)
    r.compare("BatchNorm μ", "[4, 3.6, 4.2]", mu)
    var = r.step("BatchNorm σ²", "per column, biased", z.var(0, unbiased=False), cols=NEURONS)
    r.compare("BatchNorm σ²", "[6.4, 1.04, 0.96]", var,
              why="z₂'s squared deviations are 1.96, 0.36, 2.56, 1.96, 0.36: sum 7.2, ÷ 5 = 1.44")
    r.compare("BatchNorm σ", "[2.53, 1.02, 0.98]",
              r.step("BatchNorm σ", "√σ²", var.sqrt(), cols=NEURONS),
              why="σ₂ = √1.04 follows from the wrong σ₂² (above); √1.44 = 1.2")
    bn = r.step("BatchNorm(Z)", "(Z − μ_col)/√(σ²_col + ε)", (z - mu) / torch.sqrt(var + 1e-5),
                SAMPLES, NEURONS)
    r.compare("BatchNorm(Z)", "[[1.18, 1.37, -0.20], [-0.79, -0.59, -0.20], [-1.18, -1.57, "
              "-1.22], [1.18, 1.37, 1.83], [-0.39, -0.59, -0.20]]", bn,
              why="column z₂ follows from the wrong σ₂ = 1.02 (1.4/1.02 = 1.37; with σ₂ = 1.2: "
                  "1.17); in z₁ and z₃ the text cuts digits instead of rounding "
                  "(3/2.53 = 1.186, 1/2.53 = 0.395, 1.8/0.98 = 1.837)")
    ln = r.step("LayerNorm(Z)", "per row (example), over its 3 neurons", layer_norm_rows(z),
                SAMPLES, NEURONS)
    torch_bn = nn.BatchNorm1d(3).double().train()
    torch_ln = nn.LayerNorm(3).double()
    with torch.no_grad():
        r.check("BatchNorm(Z) vs torch.nn.BatchNorm1d(3), training mode", diff(bn, torch_bn(z)),
                1e-12)
        r.check("LayerNorm(Z) vs torch.nn.LayerNorm(3)", diff(ln, torch_ln(z)), 1e-12)
    _padding(r, z, bn, ln)
    _batch_of_one(r, z)


def _padding(r: ExampleResult, z, bn, ln) -> None:
    """Padded positions (zeros) join the batch: BatchNorm's column statistics move, and with
    them every real example's output; LayerNorm's rows do not see each other."""
    padded = torch.cat([z, torch.zeros(5, 3, dtype=z.dtype)])
    rows = SAMPLES + [f"pad {i}" for i in range(1, 6)]
    r.step("Z padded", "the same 5 examples and 5 rows of padding zeros", padded, rows, NEURONS)
    mu = r.step("BatchNorm μ with padding", "the zeros pull every column's mean toward 0",
                padded.mean(0), cols=NEURONS)
    var = padded.var(0, unbiased=False)
    bn_pad = r.step("BatchNorm(Z padded), real rows", "statistics now include the padding",
                    ((padded - mu) / torch.sqrt(var + 1e-5))[:5], SAMPLES, NEURONS)
    ln_pad = r.step("LayerNorm(Z padded), real rows", "each row alone, as before",
                    layer_norm_rows(padded)[:5], SAMPLES, NEURONS)
    r.note(f"padding moves BatchNorm's output for the real examples by up to "
           f"{diff(bn_pad, bn):.2f}; LayerNorm's by {diff(ln_pad, ln):.2g}")
    r.check("LayerNorm of the real rows is unchanged by padding", diff(ln_pad, ln), 1e-12)


def _batch_of_one(r: ExampleResult, z) -> None:
    """One example (batch size 1, as at inference): every column's mean is the value itself."""
    one = z[:1]
    r.step("BatchNorm of a batch of 1", "x − μ_B = 0 in every column: the output is β, "
           "whatever the input", (one - one.mean(0)) / torch.sqrt(one.var(0, unbiased=False)
                                                              + 1e-5), SAMPLES[:1], NEURONS)
    alone = r.step("LayerNorm of a batch of 1", "unchanged: it never looked at the batch",
                   layer_norm_rows(one), SAMPLES[:1], NEURONS)
    try:
        with torch.no_grad():
            nn.BatchNorm1d(3).double().train()(one)
        refused = "accepts it"
    except ValueError as e:
        refused = f"refuses it ({str(e).splitlines()[0]})"
    r.note(f"torch.nn.BatchNorm1d in training mode {refused}; in eval mode it uses running "
           "averages from training instead of the batch")
    r.check("LayerNorm of example 1 alone equals its row in the batch",
            diff(alone, layer_norm_rows(z)[:1]), 1e-12)

