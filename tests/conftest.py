"""Shared fixtures: deterministic seeds, and float32 comparisons at 1e-5 unless said."""

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "multiprocess: starts several processes (torchrun or "
                            "spawned gloo ranks); skipped where ATTNLAB_SKIP_MULTIPROCESS=1")


def pytest_collection_modifyitems(config, items):
    """The AVX2-emulated pass of CI (make test-avx2) sets ATTNLAB_SKIP_MULTIPROCESS=1: what
    several processes check (their communication and sharding) does not depend on the CPU's
    instruction set, and the native pass has run it."""
    if os.environ.get("ATTNLAB_SKIP_MULTIPROCESS") != "1":
        return
    skip = pytest.mark.skip(reason="multi-process test: ISA-independent, run in the native pass "
                            "(ATTNLAB_SKIP_MULTIPROCESS=1)")
    for item in items:
        if "multiprocess" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def trained_marian(tmp_path_factory):
    """A Marian-shaped attnlab Transformer trained to reverse short sequences, and the same
    weights as a transformers MarianMTModel folder. Ids: pad 0 (also the decoder start, as in
    Marian), eos 1, tokens 2..31.

    It trains until greedy decoding reverses all of 128 validation sequences and their
    teacher-forced loss is below 0.05 nats a token, so its next-token distributions are
    confident (no near ties for beam search to break); how many steps that takes depends on
    the CPU's rounding (300 was not enough on some machines)."""
    from attnlab import ModelConfig, Transformer, save_pretrained
    from attnlab.generation import greedy_decode
    from attnlab.training.loss import label_smoothed_loss
    from tests.criteria import train_until

    config = ModelConfig.from_preset(
        "tiny", vocab_size=32, max_len=64, dropout=0.0, positional="sinusoidal-split",
        activation="silu", output_bias=True, pad_id=0, unk_id=0, bos_id=0, eos_id=1)
    torch.manual_seed(0)
    model = Transformer(config)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def reversal_batch(gen, n):
        length = int(torch.randint(3, 7, (1,), generator=gen))
        body = torch.randint(2, 32, (n, length), generator=gen)
        src = torch.cat([body, torch.ones(n, 1, dtype=torch.long)], 1)
        tgt = torch.cat([torch.zeros(n, 1, dtype=torch.long), body.flip(1), src[:, -1:]], 1)
        return src, tgt

    val_gen = torch.Generator().manual_seed(12345)
    val = [reversal_batch(val_gen, 32) for _ in range(4)]

    def step():
        src, tgt = reversal_batch(g, 32)
        loss = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], 0.0, pad_id=0)
        opt.zero_grad()
        (loss.loss / loss.tokens).backward()
        opt.step()

    @torch.no_grad()
    def reverses():
        model.eval()
        right = total = nll = tokens = 0
        for src, tgt in val:
            out = greedy_decode(model, src, max_len=tgt.shape[1])
            out = torch.nn.functional.pad(out, (0, tgt.shape[1] - out.shape[1]))  # all stopped
            right += int((out == tgt).all(1).sum())
            total += len(src)
            sums = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], 0.0, pad_id=0)
            nll, tokens = nll + float(sums.nll), tokens + sums.tokens
        model.train()
        return right == total and nll / tokens < 0.05, (
            f"{right}/{total} reversed, loss {nll / tokens:.3f}")

    train_until(step, reverses, "trained_marian", every=50, cap=3000)
    model.eval()
    folder = tmp_path_factory.mktemp("marian")
    save_pretrained(model, folder)
    return model, folder


PANGRAMS = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
CHAR_LM_LOSS = 0.6  # nats per character on the held-out rows: the criterion training stops at


@dataclass
class CharLM:
    """A trained character language model: its run folder, the model (eval mode), its
    tokenizer, the text it learnt (``PANGRAMS``) and held-out rows ``(8, 48)`` of that text."""

    folder: Path
    model: torch.nn.Module
    tokenizer: object
    text: str
    held_out: torch.Tensor


@pytest.fixture(scope="session")
def char_lm(tmp_path_factory) -> CharLM:
    """A 2-layer character llama-mini (RoPE, grouped-query attention, SwiGLU) trained on
    ``PANGRAMS`` until its loss on eight rotations of the text, 48 characters each, is below
    ``CHAR_LM_LOSS`` nats a character, against log(33) ≈ 3.5 for the uniform guess over its
    vocabulary; checked every 10 steps, 600 at most (tests/criteria.py). Trained weights have
    the structure quantisation meets in practice, and a perplexity far from the vocabulary's
    size, unlike a random init (about 1.006 × the vocabulary whatever its matrices hold)."""
    from attnlab import ModelConfig, build_model
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers import CharTokenizer
    from tests.criteria import train_until

    tok = CharTokenizer.train([PANGRAMS])
    config = ModelConfig.from_preset("llama-mini", vocab_size=tok.vocab_size, d_model=64,
                                     n_heads=4, num_kv_heads=2, d_ff=128, n_decoder_layers=2,
                                     max_len=64, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(config)
    ids = torch.tensor(tok.encode(PANGRAMS * 6))
    held_out = torch.tensor([tok.encode(PANGRAMS[k:] + PANGRAMS[:k])[:48]
                             for k in range(0, 80, 10)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1),
                                                 x[:, 1:].flatten())

    def step():
        starts = torch.randint(0, len(ids) - 33, (16,), generator=gen)
        opt.zero_grad()
        loss(torch.stack([ids[s : s + 33] for s in starts])).backward()
        opt.step()

    @torch.no_grad()
    def learnt():
        model.eval()
        value = loss(held_out).item()
        model.train()
        return value < CHAR_LM_LOSS, f"held-out loss {value:.3f} nats a character"

    train_until(step, learnt, "char_lm", every=10, cap=600)
    model.eval()
    folder = save_model_dir(tmp_path_factory.mktemp("char-lm") / "run", model, config,
                            {"text": tok.to_dict()})
    return CharLM(folder, model, tok, PANGRAMS, held_out)
