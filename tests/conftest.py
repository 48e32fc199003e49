"""Shared fixtures: deterministic seeds, and float32 comparisons at 1e-5 unless said."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def trained_marian(tmp_path_factory):
    """A Marian-shaped attnlab Transformer trained briefly to reverse short sequences, so its
    next-token distributions are confident (no near ties), and the same weights as a
    transformers MarianMTModel folder. Ids: pad 0 (also the decoder start, as in Marian),
    eos 1, tokens 2..31."""
    from attnlab import ModelConfig, Transformer
    from attnlab.training.loss import label_smoothed_loss

    config = ModelConfig.from_preset(
        "tiny", vocab_size=32, max_len=64, dropout=0.0, positional="sinusoidal-split",
        activation="silu", output_bias=True, pad_id=0, unk_id=0, bos_id=0, eos_id=1)
    torch.manual_seed(0)
    model = Transformer(config)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(3, 7, (1,), generator=g))
        body = torch.randint(2, 32, (32, n), generator=g)
        src = torch.cat([body, torch.ones(32, 1, dtype=torch.long)], 1)
        tgt = torch.cat([torch.zeros(32, 1, dtype=torch.long), body.flip(1), src[:, -1:]], 1)
        loss = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], 0.0, pad_id=0)
        opt.zero_grad()
        (loss.loss / loss.tokens).backward()
        opt.step()
    model.eval()
    folder = tmp_path_factory.mktemp("marian")
    model.save_pretrained(folder)
    return model, folder
