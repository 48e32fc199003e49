"""``--accumulate N``: N micro-batches of b examples make one optimizer step on the gradient of
one batch of N·b, for the trainers of the BERT family (``train classify``) and ``train image``.

Each case trains one step three ways from the same seed: one batch of 8, two accumulated
micro-batches of 4, and one batch of 4 (which must differ, or the comparison proves nothing).
Both training streams cut each epoch's permutation into consecutive slices, so the batch of 8
is exactly the two micro-batches of 4. The gradient is read as the trainer clips it (before
clipping, which would hide a wrong scale), and the weights after the step from the checkpoint.
Dropout (and attention dropout) is off: two passes of 4 draw other masks than one pass of 8.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from attnlab import BERT, ModelConfig, save_pretrained
from attnlab.tokenizers import WordPieceTokenizer
from tests.cli.helpers import cli

WORDS = "good fine great bad awful poor the a film plot was very".split()
CLIP = torch.nn.utils.clip_grad_norm_  # the real one, which each run's recording wraps


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Labelled JSON lines and a random bert-tiny without dropout to fine-tune on them."""
    folder = tmp_path_factory.mktemp("accumulate")
    rng = random.Random(0)
    rows = [{"id": i, "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 9))),
             "label": "ab"[i % 2]} for i in range(120)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "corpus.txt").write_text("\n".join(r["text"] for r in rows))
    tok = WordPieceTokenizer.train([folder / "corpus.txt"], vocab_size=40)
    torch.manual_seed(0)
    save_pretrained(BERT(ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size,
                                                 max_len=32, dropout=0.0,
                                                 attention_dropout=0.0)), folder / "bert")
    tok.backend.save(str(folder / "bert" / "tokenizer.json"))
    return folder


def _one_step(capsys, monkeypatch, out, argv, batch: int, accumulate: int):
    """Train one step: ``(gradient before clipping, weights after the step)``."""
    grads = {}

    def recording_clip(parameters, *args, **kwargs):
        parameters = list(parameters)
        grads.update({i: p.grad.detach().clone() for i, p in enumerate(parameters)
                      if p.grad is not None})
        return CLIP(parameters, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    r = cli(capsys, *argv, "--batch", batch, "--accumulate", accumulate, "--steps", "1",
            "--warmup", "0", "--lr", "1e-3", "--out", out, "--no-progress", "--device", "cpu",
            "--precision", "fp32")
    assert r.code == 0, r.err
    assert grads, "the trainer clipped no gradient"
    return grads, load_file(out / "checkpoints" / "step-00000001" / "model.safetensors")


def _command(kind: str, folder) -> list:
    if kind == "classify":
        return ["train", "classify", "--data", folder / "data.jsonl", "--text-field", "text",
                "--label-field", "label", "--init", folder / "bert", "--max-len", "16"]
    return ["train", "image", "--data", "digits", "--set", "dropout=0.0", "--set",
            "attention_dropout=0.0", "--eval-every", "0"]


@pytest.mark.parametrize("kind", ["classify", "image"])
def test_accumulated_micro_batches_step_as_one_batch(capsys, monkeypatch, tmp_path, labelled,
                                                     kind):
    argv = _command(kind, labelled)
    whole_grad, whole = _one_step(capsys, monkeypatch, tmp_path / "whole", argv, 8, 1)
    acc_grad, acc = _one_step(capsys, monkeypatch, tmp_path / "acc", argv, 4, 2)
    half_grad, half = _one_step(capsys, monkeypatch, tmp_path / "half", argv, 4, 1)

    assert whole_grad.keys() == acc_grad.keys()
    for i, g in whole_grad.items():
        torch.testing.assert_close(acc_grad[i], g, rtol=1e-5, atol=1e-7)
    assert any(not torch.allclose(half_grad[i], g, rtol=1e-3, atol=1e-6)
               for i, g in whole_grad.items())  # another batch: another gradient
    # Adam's first step is lr · g / (|g| + eps): where g is within rounding of zero, rounding
    # moves the update by a share of the lr (1e-3), so the weights agree to 1% of one step
    assert whole.keys() == acc.keys()
    for name, w in whole.items():
        torch.testing.assert_close(acc[name], w, rtol=0, atol=1e-5)
    assert any(not torch.allclose(half[name], w, rtol=0, atol=1e-4)
               for name, w in whole.items())
