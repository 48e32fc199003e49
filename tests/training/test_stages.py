"""Pipeline parallelism against one process: 2 stages (2 gloo processes on 127.0.0.1), GPipe
and 1F1B, 4 micro-batches of 2 rows, for GPT-2 (tied head, learned positions), a Llama-style
GPT (RoPE, RMSNorm, SwiGLU, grouped-query attention, a sliding window, untied head) and BERT's
masked LM on padded batches of two lengths. One spawn runs every case; each test reads its
case's results and compares them with the same model and batches run in this process."""

from __future__ import annotations

import datetime
import functools
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnlab.config import ModelConfig
from attnlab.data.stream import LMBatch, MaskedLMBatch
from attnlab.errors import BadInput
from attnlab.models.bert import BERT
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.training.objectives import CausalLM, MaskedLM, Seq2Seq
from attnlab.training.stages import Pipeline

CASES = ("gpt2", "llama", "bert")
SCHEDULES = ("gpipe", "1f1b")
RUNS = [(c, s) for c in CASES for s in SCHEDULES]
WORLD, MICROBATCHES, ROWS, SCALE = 2, 4, 8, 0.125
TIED = {"gpt2": ("embed.weight", "lm_head.weight"), "bert": ("embed.weight", "mlm.weight")}
TOL = dict(rtol=1e-5, atol=1e-5)


def _config(case: str, **overrides) -> ModelConfig:
    small = dict(vocab_size=64, d_model=32, n_heads=4, d_ff=64, max_len=32, dropout=0.0)
    if case == "gpt2":
        return ModelConfig.from_preset("gpt-mini", n_decoder_layers=4, **small, **overrides)
    if case == "llama":
        return ModelConfig.from_preset("llama-mini", n_decoder_layers=4, num_kv_heads=2,
                                       tie_embeddings=False, sliding_window=5,
                                       **small, **overrides)
    return ModelConfig.from_preset("bert-mini", n_encoder_layers=4, attention_dropout=0.0,
                                   **{"head": "mlm", **small, **overrides})


def _model_and_task(case: str, **overrides):
    torch.manual_seed(0)  # the same initial weights on every rank and here
    if case == "bert":
        return BERT(_config(case, **overrides)), MaskedLM()
    return GPT(_config(case, **overrides)), CausalLM(0.1 if case == "gpt2" else 0.0)


def _batches(case: str) -> list:
    """Two batches of ROWS rows; BERT's right-padded to 10 and 7 positions."""
    g = torch.Generator().manual_seed(1)
    if case != "bert":
        ids = torch.randint(4, 64, (2, ROWS, 9), generator=g)
        return [LMBatch(b[:, :-1], b[:, 1:]) for b in ids]
    out = []
    for width in (10, 7):
        lengths = torch.randint(3, width + 1, (ROWS,), generator=g)
        lengths[0] = width
        real = torch.arange(width) < lengths[:, None]
        ids = torch.randint(4, 64, (ROWS, width), generator=g) * real
        picked = real & (torch.rand(ROWS, width, generator=g) < 0.3)
        labels = torch.where(picked, ids, -100)
        types = (torch.arange(width) >= lengths[:, None] // 2).long() * real
        out.append(MaskedLMBatch(torch.where(picked, 3, ids), types, real.long(), labels,
                                 torch.zeros(ROWS, dtype=torch.long)))
    return out


def _run_cases(rank: int, port: int, out_dir: str) -> None:
    """Worker (one process a stage): every case and schedule, results saved for the test."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        for case, schedule in RUNS:
            model, task = _model_and_task(case)
            pipe = Pipeline(model, task, rank, WORLD, None, MICROBATCHES, schedule)
            sums = [pipe.step(b, SCALE) for b in _batches(case)]
            grads = {n: p.grad.clone() for n, p in pipe.module.named_parameters()}
            pipe.sync_tied()
            synced = {n: p.grad.clone() for n, p in pipe.module.named_parameters()}
            torch.save({"sums": sums, "grads": grads, "synced": synced,
                        "norm": [n for n, p in pipe.module.named_parameters()
                                 if any(p is q for q in pipe.norm_parameters())],
                        "first": pipe.is_first, "last": pipe.is_last,
                        "state": pipe.full_state_dict()},
                       os.path.join(out_dir, f"{case}-{schedule}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{(case, schedule): [rank 0's results, rank 1's]} from one spawn of WORLD processes."""
    out = tmp_path_factory.mktemp("pipeline")
    ctx = mp.start_processes(_run_cases, args=(_free_port(), str(out)), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("pipeline workers ran past 60 s")
    return {(c, s): [torch.load(out / f"{c}-{s}-{r}.pt") for r in range(WORLD)]
            for c, s in RUNS}


@functools.cache
def _reference(case: str) -> tuple[list[tuple[float, float]], dict, dict]:
    """One process: (loss, nll) per batch, gradients by every name (a tied matrix under both
    of its names), state dict."""
    model, task = _model_and_task(case)
    sums = []
    for b in _batches(case):
        s = task.loss(model, b)
        (s.loss * SCALE).backward()
        sums.append((s.loss.item(), s.nll.item()))
    grads = {n: p.grad for n, p in model.named_parameters(remove_duplicate=False)}
    return sums, grads, model.state_dict()


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "schedule"), RUNS)
def test_loss_matches_one_process(runs, case, schedule):
    first, last = runs[case, schedule]
    expected, _, _ = _reference(case)
    assert first["sums"] == [(0.0, 0.0)] * 2  # only the last stage has the loss
    for got, want in zip(last["sums"], expected, strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **TOL)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "schedule"), RUNS)
def test_gradients_match_one_process(runs, case, schedule):
    """Every parameter's gradient (two steps accumulated) on the stage that holds it; the
    stages hold each parameter once, the tied matrix on both ends."""
    first, last = runs[case, schedule]
    _, expected, _ = _reference(case)
    assert first["first"] and not first["last"] and last["last"] and not last["first"]
    assert any(n.startswith("blocks.layers.1.") or n.startswith("encoder.layers.1.")
               for n in first["grads"])
    assert not any(".layers.2." in n for n in first["grads"])
    tied = TIED.get(case, ())
    assert set(first["grads"]) | set(last["grads"]) == set(expected)
    assert not (set(first["grads"]) & set(last["grads"]))
    for stage in (first, last):
        for name, grad in stage["grads"].items():
            if name not in tied:
                torch.testing.assert_close(grad, expected[name], **TOL, msg=name)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "schedule"), [r for r in RUNS if r[0] in TIED])
def test_sync_tied_sums_the_two_uses(runs, case, schedule):
    """Before sync_tied each end holds its own use's gradient; after, both hold their sum,
    the unsplit model's gradient, and the gradient norm counts the matrix once."""
    first, last = runs[case, schedule]
    _, expected, _ = _reference(case)
    embed, head = TIED[case]
    want = expected[embed]
    assert not torch.allclose(first["grads"][embed], want, **TOL)
    torch.testing.assert_close(first["grads"][embed] + last["grads"][head], want, **TOL)
    torch.testing.assert_close(first["synced"][embed], want, **TOL)
    torch.testing.assert_close(last["synced"][head], want, **TOL)
    assert embed in first["norm"] and head not in last["norm"]


@pytest.mark.multiprocess
def test_untied_head_is_the_last_stages_alone(runs):
    first, last = runs["llama", "gpipe"]
    assert "lm_head.weight" in last["norm"] and "embed.weight" in first["norm"]
    for stage in (first, last):
        for name in stage["grads"]:
            assert torch.equal(stage["synced"][name], stage["grads"][name])


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", CASES)
def test_full_state_dict_is_the_unsplit_models(runs, case):
    first, last = runs[case, "gpipe"]
    model, _ = _model_and_task(case)  # the same seed: the weights the stages started from
    expected = model.state_dict()
    assert last["state"] is None
    assert list(first["state"]) == list(expected)
    for name, value in expected.items():
        torch.testing.assert_close(first["state"][name], value, rtol=0, atol=0, msg=name)


# --- in one process ----------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_one_stage_accumulates_micro_batches(case):
    """size 1 needs no process group: the micro-batches' gradients add up to the batch's."""
    expected_sums, expected, _ = _reference(case)
    model, task = _model_and_task(case)
    pipe = Pipeline(model, task, 0, 1, None, MICROBATCHES)
    sums = [pipe.step(b, SCALE) for b in _batches(case)]
    torch.testing.assert_close(torch.tensor(sums), torch.tensor(expected_sums), **TOL)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], **TOL, msg=name)


def test_bad_input_is_one_line():
    model, task = _model_and_task("gpt2")
    with pytest.raises(BadInput, match="--pp 5: more stages than the model's 4 layers"):
        Pipeline(model, task, 0, 5, None, MICROBATCHES)
    with pytest.raises(BadInput, match="3 micro-batches do not divide the batch's 8 rows"):
        Pipeline(model, task, 0, 1, None, 3).step(_batches("gpt2")[0], SCALE)
    with pytest.raises(BadInput, match="2 micro-batches for 4 stages: the 1f1b schedule"):
        Pipeline(*_model_and_task("gpt2"), 0, 4, None, 2, "1f1b")
    with pytest.raises(BadInput, match="does not support next-sentence prediction"):
        Pipeline(*_model_and_task("bert", head="pretraining"), 0, 2, None, MICROBATCHES)
    with pytest.raises(BadInput, match="supports decoder-only and encoder-only language"):
        Pipeline(GPT(_config("gpt2")), MaskedLM(), 0, 2, None, MICROBATCHES)
    translator = Transformer(ModelConfig.from_preset("tiny", d_model=32, d_ff=64))
    with pytest.raises(BadInput, match="only decoder-only and encoder-only language models"):
        Pipeline(translator, Seq2Seq(0, 0.1), 0, 2, None, MICROBATCHES)
