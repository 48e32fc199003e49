"""The course's worked examples (attnlab.explain.examples): every number an example computes
is asserted here against a value this file computes on its own (numpy, torch.nn, torch's
attention, autograd), every discrepancy it reports is a real one (the recomputed value,
rounded to the text's printed precision, is not what the text prints), and every value it
says agrees does agree. The CLI is in tests/cli/test_explain_examples.py."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import BadInput
from attnlab.explain.examples import list_examples, run_example
from attnlab.explain.examples.report import format_example

NAMES = [e.name for e in list_examples()]
COURSE = {"1-self-attention-and-encoder.txt", "2-attention-is-all-you-need-guide.txt",
          "3-mathematics-of-transformers.txt", "4-bert-gpt-training-fine-tuning.txt",
          "5-transformer-network-forward-pass.txt"}


@pytest.fixture(scope="module")
def results():
    return {name: run_example(name) for name in NAMES}


def close(a, b, tol=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64),
                               np.asarray(b, dtype=np.float64), atol=tol, rtol=0)


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layer_norm(x, eps=1e-5):
    x = np.asarray(x, dtype=np.float64)
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)


@pytest.mark.parametrize("name", NAMES)
def test_each_example_names_its_source_and_passes_its_checks(results, name):
    r = results[name]
    assert r.example.source.split(" ")[0] in COURSE, r.example.source
    assert r.checks and all(c.ok for c in r.checks), [c for c in r.checks if not c.ok]
    assert r.printed, "an example sets at least one of the text's values against its own"


@pytest.mark.parametrize("name", NAMES)
def test_discrepancies_are_real_and_agreements_agree(results, name):
    """Rounded to the digits the text printed (a tie either way), the recomputed value gives
    the text's exactly when the example reports no discrepancy; a discrepancy carries its
    reason."""
    for p in results[name].printed:
        scale = 10.0 ** p.decimals.numpy()
        rec = p.recomputed.numpy() * scale
        # the printed value's integer count of its last digit, rounding a tie either way
        lowest, highest = np.ceil(rec - 0.5 - 1e-9), np.floor(rec + 0.5 + 1e-9)
        printed = np.round(p.course.numpy() * scale)
        matches = (lowest <= printed) & (printed <= highest)
        if p in results[name].discrepancies:
            assert not matches.all() and p.why, (p.what, p.text, rec)
        else:
            assert matches.all() and not p.why, (p.what, p.text, rec)


def test_the_text_shows_every_step_and_discrepancy(results):
    for r in results.values():
        text = format_example(r)
        assert all(s.name in text for s in r.steps)
        assert all(p.text in text and p.why in text for p in r.discrepancies)


def test_an_unknown_example_names_the_known_ones():
    with pytest.raises(BadInput) as e:
        run_example("no-such-example")
    assert "no-such-example" in str(e.value) and all(n in str(e.value) for n in NAMES)
    assert len(NAMES) == len(set(NAMES))


def test_tiny_attention_against_numpy_and_autograd(results):
    v = results["tiny-attention"].values
    q = torch.tensor([[1., 0, 1], [0, 1, 1]], dtype=torch.float64, requires_grad=True)
    k = torch.tensor([[1., 1, 0], [1, 0, 1]], dtype=torch.float64, requires_grad=True)
    val = torch.tensor([[2., 0, 1], [1, 1, 0]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1., 0, 1], [0, 1, 0]], dtype=torch.float64)
    s = (q @ k.T / math.sqrt(3)).detach().requires_grad_()
    out = F.scaled_dot_product_attention(q[None], k[None], val[None])[0]
    (g * out).sum().backward()
    a = softmax(s.detach().numpy())
    (g * (torch.softmax(s, -1) @ val.detach())).sum().backward()
    close(v["S"], s.detach())
    close(v["A"], a)
    close(v["O"], out.detach())
    close(v["dV"], val.grad)
    close(v["dQ"], q.grad)
    close(v["dK"], k.grad)
    close(v["dA"], g.numpy() @ val.detach().numpy().T)
    close(v["dS"], s.grad)


def test_softmax_and_similarity_against_numpy(results):
    v = results["softmax"].values
    e = np.exp([2.0, 1.0, 0.1])
    close(v["Σ e^s"], e.sum())
    close(v["softmax(s)"], e / e.sum())
    v = results["similarity"].values
    a, b = np.array([0.8, 0.2, 0.1]), np.array([0.7, 0.3, 0.2])
    close(v["cos(A, B)"], a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    close(v["‖A − B‖"], np.linalg.norm(a - b))


def test_gradient_descent_lr_and_losses(results):
    close(results["gradient-descent"].values["x_k, k = 0..11"], 3 * 0.8 ** np.arange(12))
    v = results["lr-peak"].values
    close(v["peak lr"], 1 / math.sqrt(512 * 4000))
    close(v["lr(t) / peak"], [0.5, 1.0, math.sqrt(4 / 6), math.sqrt(4 / 8), math.sqrt(4 / 10)])
    v = results["label-smoothing"].values
    close(v["smoothed target q"], [0.02, 0.02, 0.92, 0.02, 0.02])
    logits = v["logits (not stated: seed 0)"]
    close(v["loss"], F.cross_entropy(logits[None], torch.tensor([2]), label_smoothing=0.1))
    v = results["sequence-loss"].values
    close(v["loss"], -np.log([0.8, 0.7, 0.9, 0.85]).sum())


def test_norms_against_torch_nn(results):
    v = results["layernorm"].values
    with torch.no_grad():
        close(v["LayerNorm(x)"], nn.LayerNorm(4).double()(torch.tensor([2., 4, 6, 8]).double()))
    bn = nn.BatchNorm1d(1).double().train()
    with torch.no_grad():
        bn.weight.fill_(0.5)
        bn.bias.fill_(0.1)
        y = bn(torch.tensor([[7.], [2], [5], [4]], dtype=torch.float64))[:, 0]
    close(results["batchnorm"].values["y"], y)
    v = results["batchnorm-vs-layernorm"].values
    z = np.array([[7, 5, 4], [2, 3, 4], [1, 2, 3], [7, 5, 6], [3, 3, 4]], dtype=np.float64)
    close(v["BatchNorm σ²"], z.var(0))
    with torch.no_grad():
        close(v["BatchNorm(Z)"], nn.BatchNorm1d(3).double().train()(torch.from_numpy(z)))
        padded = torch.from_numpy(np.vstack([z, np.zeros((5, 3))]))
        close(v["BatchNorm(Z padded), real rows"], nn.BatchNorm1d(3).double().train()(padded)[:5])
    close(v["LayerNorm(Z)"], layer_norm(z))
    close(v["LayerNorm(Z padded), real rows"], layer_norm(z))
    close(v["BatchNorm of a batch of 1"], np.zeros((1, 3)))


def _pe(pos, dim, d):
    angle = pos / 10000 ** ((dim - dim % 2) / d)
    return np.sin(angle) if dim % 2 == 0 else np.cos(angle)


def test_positional_tables_against_the_formula(results):
    v = results["positional-encoding"].values
    close(v["PE, d = 4, positions 0–2"], [[_pe(p, j, 4) for j in range(4)] for p in range(3)])
    close(v["PE(3), d = 6"], [_pe(3, j, 6) for j in range(6)])
    close(v["PE(5), d = 512"], [_pe(5, j, 512) for j in (0, 1, 2, 3, 128, 510, 511)])
    close(v["PE(5), d = 512"][:2], [math.sin(5), math.cos(5)])


def test_attention_examples_against_torch_attention(results):
    v = results["guide-example-1"].values
    x = torch.tensor([[1., 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=torch.float64)
    close(v["output"], F.scaled_dot_product_attention(x[None], x[None], x[None])[0])
    v = results["it-attention"].values
    q = torch.tensor([[0.2, 0.5, 0.1]], dtype=torch.float64)
    keys = torch.tensor([[0.3, 0.2, 0.1], [0.1, 0.3, 0.2], [0.2, 0.6, 0.1], [0.2, 0.5, 0.1]],
                        dtype=torch.float64)
    vals = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1], [0.1, 0.8, 0.1], [0.3, 0.4, 0.3]],
                        dtype=torch.float64)
    close(v["weights"], softmax((q @ keys.T).numpy() / math.sqrt(3))[0])
    close(v["output"], F.scaled_dot_product_attention(q[None], keys[None], vals[None])[0, 0])
    v = results["self-attention-steps"].values
    w_q = np.array([[0.2, 0.3, 0.1], [0.4, 0.2, 0.5], [0.1, 0.6, 0.3], [0.3, 0.1, 0.4]])
    close(v["q₁ = x₁·W^Q"], np.array([0.2, 0.5, 0.1, 0.3]) @ w_q)
    s = np.array([[1.2, 0.5, 0.3, 0.1], [0.8, 2.1, 1.5, 0.9], [0.4, 1.3, 1.8, 1.2],
                  [0.2, 0.7, 1.1, 2.0]])
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    close(results["causal-row"].values["A"], softmax(np.where(allowed, s, -np.inf)))


def test_forward_pass_against_numpy(results):
    """The whole pass redone in numpy from the text's inputs and the example's drawn weights."""
    v = results["forward-pass"].values
    w = {name.split(" (")[0]: v[name].numpy() for name in v if "(not stated" in name}
    x = np.array([[0.5, -0.3, 0.2, 0.8], [0.1, 0.7, -0.4, 0.3]]) + np.array(
        [[0.0, 1.0, 0.0, 1.0], [0.84, 0.54, 0.01, 1.0]])
    w_q = np.array([[0.5, 0.1], [-0.2, 0.4], [0.3, -0.1], [0.1, 0.2]])
    w_k = np.array([[0.3, 0.2], [0.1, 0.5], [-0.1, 0.3], [0.4, 0.1]])
    w_v = np.array([[0.4, 0.1], [0.2, 0.3], [-0.1, 0.4], [0.3, 0.2]])

    def attend(q_in, kv_in, wq, wk, wv, wo):
        q, k, val = q_in @ wq, kv_in @ wk, kv_in @ wv
        return softmax(q @ k.T / math.sqrt(2)) @ val @ wo

    def ffn(h, side):
        return np.maximum(h @ w[f"{side}W₁"] + w[f"{side}b₁"], 0) @ w[f"{side}W₂"] + w[f"{side}b₂"]

    close(v["Q"], x @ w_q)
    x1 = layer_norm(x + attend(x, x, w_q, w_k, w_v, w["W^O"]))
    memory = layer_norm(x1 + ffn(x1, ""))
    close(v["memory"], memory)
    y = np.array([[0.1, 1.2, 0.3, 1.4]])  # E[<S>] + PE[0]
    y1 = layer_norm(y + attend(y, y, *(w[f"dec W^{n}"] for n in "QKVO")))
    y2 = layer_norm(y1 + attend(y1, memory, *(w[f"cross W^{n}"] for n in "QKVO")))
    h = layer_norm(y2 + ffn(y2, "dec "))
    close(v["h"], h)
    close(v["probabilities"], softmax(h @ w["W_U"]))
    text_residual = np.array([[1.22, 1.27, 0.65, 2.43], [1.66, 1.81, 0.09, 1.91]])
    close(v["text's LayerNorm(X + attention output)"], layer_norm(text_residual))
