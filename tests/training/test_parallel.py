"""Training beyond one device (attnlab.training.parallel, sharded): each strategy against the
unsplit model computed in the same test. Tensor parallelism and activation checkpointing are
checked in-process (gloo, spawned ranks); FSDP, FSDP × TP and the sharded checkpoints as a
user runs them, through torchrun and the CLI. Tiny models, fp32, dropout 0 where equality is
asserted."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.training import parallel
from tests.training.ranks import run_ranks

multiprocess = pytest.mark.multiprocess

TINY = dict(d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_len=32, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0)
FAMILIES = {
    "gpt2": ("gpt-mini", dict(n_decoder_layers=2)),  # fused QKV, learned positions, GELU
    "llama": ("llama-mini", dict(n_decoder_layers=2, num_kv_heads=2)),  # GQA, RoPE, SwiGLU
    "alibi": ("gpt-mini", dict(n_decoder_layers=2, positional="alibi")),  # a bias per head
    "bert": ("bert-tiny", dict(n_encoder_layers=2, head="mlm")),
    "t5": ("t5-small", dict(n_encoder_layers=2, n_decoder_layers=2, head_dim=8)),  # rel. bias
}


def _config(family: str) -> ModelConfig:
    preset, knobs = FAMILIES[family]
    return ModelConfig.from_preset(preset, **TINY, **knobs)


def _inputs(config: ModelConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (3, 12), generator=g)
    if config.arch == "encoder":
        mask = torch.ones_like(ids)
        mask[1, 8:] = 0  # a padded row
        return dict(ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask)
    if config.arch == "encoder-decoder":
        return dict(src_ids=ids, tgt_ids=torch.randint(3, config.vocab_size, (3, 9),
                                                       generator=g))
    return dict(ids=ids)


def _loss(model, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and a loss that weighs every logit differently (so each gradient counts)."""
    logits = model(**_inputs(config))
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    return logits, (logits * weights).sum()


def _grads(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
            for name, p in model.named_parameters()}


def _split_dim(p) -> int | None:
    """The dim a parameter is sharded along over the tp ranks (None: whole on every rank)."""
    from torch.distributed.tensor import DTensor, Shard

    dims = [s.dim for s in p.placements if isinstance(s, Shard)] if isinstance(p, DTensor) else []
    return dims[0] if dims else None


def _tensor_parallel_worker(rank: int, world: int) -> dict:
    from attnlab.nn.multihead import MultiHeadAttention
    from attnlab.placement import tp_dim

    found = {}
    layout = parallel.RankMesh(parallel.ParallelPlan(world=world, tp=world), torch.device("cpu"))
    for family in FAMILIES:
        config = _config(family)
        torch.manual_seed(0)
        reference = build_model(config)
        model = copy.deepcopy(reference)
        parallel.apply_tensor_parallel(model, layout)
        expected, loss = _loss(reference, config)
        loss.backward()
        got, loss = _loss(model, config)
        loss.backward()
        grads = parallel.fused_state(_grads(model), config)
        ref_grads = dict(_grads(reference))
        attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        found[family] = {
            "logits": (got - expected).abs().max().item(),
            # relative to each gradient's size (the loss sums 1,800 weighted logits)
            "grads": max(((grads[k] - ref_grads[k]).abs().max()
                          / ref_grads[k].abs().max().clamp(min=1)).item() for k in ref_grads),
            "same_names": sorted(grads) == sorted(ref_grads),
            "heads": sorted({(m.n_heads, m.num_kv_heads) for m in attention}),
            "q_rows": sorted({m.q_proj.weight.to_local().shape[0] for m in attention}),
            "kv_rows": sorted({m.k_proj.weight.to_local().shape[0] for m in attention}),
            "bias_heads": sorted({tuple(m.original_heads) for m in attention}),
            "ffn_rows": sorted({m.ffn.w1.weight.to_local().shape[0] for m in model.modules()
                                if hasattr(m, "ffn")}),
            # the engine split each tensor as the table the memory planner reads says
            "not_as_planned": [(name, _split_dim(p), tp_dim(name))
                               for name, p in model.named_parameters()
                               if _split_dim(p) != tp_dim(name)],
            "split": sum(tp_dim(name) is not None for name, _ in model.named_parameters()),
        }
    return found


@multiprocess
def test_tensor_parallel_forward_and_backward_equal_the_unsharded_model(tmp_path):
    ranks = run_ranks(_tensor_parallel_worker, 2, tmp_path)
    for rank, found in enumerate(ranks):
        for family, f in found.items():
            config = _config(family)
            h, kv, d_k = config.n_heads, config.kv_heads, config.d_k
            assert f["logits"] <= 1e-5 and f["grads"] <= 1e-5, (family, f)
            assert f["same_names"], family
            assert f["heads"] == [[h // 2, kv // 2]], (family, f["heads"])  # h / N heads
            assert f["q_rows"] == [h // 2 * d_k] and f["kv_rows"] == [kv // 2 * d_k], family
            assert f["ffn_rows"] == [config.d_ff // 2], family
            assert f["not_as_planned"] == [] and f["split"] > 0, (family, f["not_as_planned"])
            # this rank's heads: ALiBi's slopes are taken for them (T5's bias table is split
            # by head columns instead)
            assert f["bias_heads"] == [list(range(rank * h // 2, (rank + 1) * h // 2))], family


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
@pytest.mark.parametrize("mode", ["block", "sqrt"])
def test_activation_checkpointing_gives_equal_gradients_and_recomputes(family, mode):
    config = _config(family)
    if config.arch == "decoder":
        config = ModelConfig.from_dict({**config.to_dict(), "n_decoder_layers": 5})
    torch.manual_seed(0)
    reference = build_model(config)
    model = copy.deepcopy(reference)
    parallel.apply_checkpointing(model, mode)
    kept = {}
    for name, m in (("none", reference), (mode, model)):
        with torch.autograd.graph.saved_tensors_hooks(*_counting(kept, name)):
            _, loss = _loss(m, config)
        loss.backward()
    grads = _grads(model)
    assert all(torch.equal(grads[k], g) for k, g in _grads(reference).items())
    # the forward pass kept fewer activations for backward: a checkpoint keeps its input
    assert kept[mode] < kept["none"] / 2, kept
    assert model.state_dict().keys() == reference.state_dict().keys()


def _counting(kept: dict, name: str):
    """saved_tensors_hooks that add up the bytes autograd keeps for backward."""
    kept[name] = 0

    def pack(t):
        kept[name] += t.numel() * t.element_size()
        return t

    return pack, lambda t: t


def test_sqrt_checkpointing_keeps_fewer_activations_than_block():
    config = ModelConfig.from_preset("gpt-mini", **{**TINY, "n_decoder_layers": 9})
    kept = {}
    for mode in ("block", "sqrt"):
        model = build_model(config)
        parallel.apply_checkpointing(model, mode)
        with torch.autograd.graph.saved_tensors_hooks(*_counting(kept, mode)):
            _loss(model, config)
    # 9 layers: block keeps 9 layers' inputs, sqrt those of 3 segments of 3 layers; an input
    # is x (batch, seq, d_model) fp32 and the positions (seq,) int64
    layer_input = 3 * 12 * 32 * 4 + 12 * 8
    assert kept["block"] - kept["sqrt"] == 6 * layer_input, kept


def test_a_checkpointed_model_decodes_with_its_kv_cache_as_before():
    config = ModelConfig.from_preset("gpt-mini", **{**TINY, "n_decoder_layers": 4})
    torch.manual_seed(0)
    reference = build_model(config).eval()
    ids = torch.randint(3, config.vocab_size, (1, 6))
    for mode in ("block", "sqrt"):
        model = copy.deepcopy(reference)
        parallel.apply_checkpointing(model, mode)
        with torch.no_grad():
            cache = model.new_cache(16)
            model(ids[:, :5], cache=cache)
            step = model(ids[:, 5:], cache=cache)
            full = reference(ids)
        assert (step[:, -1] - full[:, -1]).abs().max() <= 1e-5, mode
        assert [c.length for c in cache] == [6] * 4, mode


def test_albert_shared_layer_is_checkpointed_once_per_use():
    config = ModelConfig.from_preset("albert-base", **{**TINY, "n_encoder_layers": 3,
                                                        "embedding_size": 16, "head": "mlm"})
    torch.manual_seed(0)
    reference = build_model(config)
    model = copy.deepcopy(reference)
    parallel.apply_checkpointing(model, "sqrt")
    for m in (reference, model):
        _loss(m, config)[1].backward()
    assert all(torch.equal(_grads(model)[k], g) for k, g in _grads(reference).items())


def test_a_checkpoints_metadata_cannot_run_code_or_name_files_outside(tmp_path):
    import pickle

    from attnlab.storage import CheckpointError
    from attnlab.training import sharded

    class Payload:  # unpickling it would create a file
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    good = tmp_path / "good"
    sharded.save_sharded(good, model, optimizer)
    sharded.load_sharded(good, model, optimizer)  # its own checkpoint loads
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match="not a checkpoint's metadata"):
        sharded.load_sharded(bad, model, optimizer)
    assert not (tmp_path / "pwned").exists()
    # a record that names a file outside the folder
    metadata = pickle.loads((good / ".metadata").read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../elsewhere.distcp"
    (bad / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="names a file outside its folder"):
        sharded.load_sharded(bad, model, optimizer)


def test_gathering_a_model_leaves_the_random_stream_alone():
    """Rank 0 builds a plain model of the gathered weights at each checkpoint; its random
    initialisation must not move rank 0's RNG, which TP ranks share for their dropout."""
    from attnlab.training import sharded

    config = _config("gpt2")
    state = build_model(config).state_dict()
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    plain = sharded.plain_model(state, config)
    assert torch.equal(torch.rand(4), expected)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in state.items())


# --- as a user runs them: torchrun and the CLI --------------------------------------------
TRAIN = ["train", "translate", "--task", "numbers", "--n-train", "2000", "--preset", "tiny",
         "--max-tokens", "600", "--warmup", "50", "--no-progress", "--no-evaluate",
         "--set", "dropout=0.0", "--set", "bias=false", "--precision", "fp32"]
FSDP = [*TRAIN, "--parallel", "fsdp", "--activation-checkpointing", "block"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args, nproc: int | None = None, env=None, timeout: int = 120):
    launcher = [sys.executable, "-m", "attnlab.cli"] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(nproc), "-m", "attnlab.cli"]
    return subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: 6 steps in one process, a checkpoint every 3."""
    out = tmp_path_factory.mktemp("one")
    r = _cli(*TRAIN, "--steps", "6", "--save-every", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def fsdp_two_ranks(tmp_path_factory):
    """The same 6 steps on 2 FSDP ranks with each block checkpointed, stopped by SIGTERM (on
    every rank) after step 3, then resumed on 2 ranks."""
    out = tmp_path_factory.mktemp("fsdp")
    common = [*FSDP, "--steps", "6", "--save-every", "3", "--out", str(out)]
    r = _cli(*common, nproc=2, env={"ATTNLAB_FAULT": "term@step:3"})
    assert r.returncode != 0 and "SIGTERM at step 3" in r.stderr, r.stderr[-3000:]
    stopped = tmp_path_factory.mktemp("stopped")
    subprocess.run(["cp", "-r", f"{out}/.", str(stopped)], check=True)
    r = _cli(*common, "--resume", nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step 3" in r.stdout
    return out, stopped


@multiprocess
def test_fsdp_training_equals_one_process(one_process, fsdp_two_ranks):
    run, _ = fsdp_two_ranks
    assert _max_diff(_weights(run, 6), _weights(one_process, 6)) <= 1e-5
    ref, got = _losses(one_process), _losses(run)
    assert sorted(got) == list(range(1, 7))
    assert max(abs(got[s] - ref[s]) for s in ref) <= 1e-5
    # each rank wrote its part of the sharded checkpoint beside the gathered model folder
    shards = sorted(p.name for p in (run / "checkpoints/step-00000006/sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not list((run / "checkpoints").glob(".tmp-*"))


@multiprocess
def test_sharded_checkpoint_resumes_on_two_ranks_bitwise(fsdp_two_ranks, tmp_path):
    run, _ = fsdp_two_ranks
    straight = tmp_path / "straight"
    r = _cli(*FSDP, "--steps", "6", "--save-every", "3", "--out", str(straight), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _losses(run) == _losses(straight)  # the resumed run, bitwise
    a, b = _weights(run, 6), _weights(straight, 6)
    assert all(torch.equal(a[k], b[k]) for k in a)


@multiprocess
def test_sharded_checkpoint_resumes_in_one_plain_process(one_process, fsdp_two_ranks,
                                                         tmp_path):
    """The laptop after the cluster: the 2-rank FSDP run stopped after step 3 goes on with a
    plain ``attnlab train --resume``, no torchrun, no --parallel. DCP loads the shards into the
    unsharded model and its optimizer, so steps 4-6 are those of a run never interrupted (the
    one-process one: the resumed FSDP run reads the shards as this one does); a model or Adam
    state not restored would change them."""
    _, stopped = fsdp_two_ranks
    laptop = tmp_path / "laptop"
    shutil.copytree(stopped, laptop)
    for later in (laptop / "checkpoints").glob("step-*"):  # another test may resume `stopped`
        if later.name != "step-00000003":
            shutil.rmtree(later)
    r = _cli(*TRAIN, "--steps", "6", "--save-every", "3", "--out", str(laptop), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step 3" in r.stdout
    assert "torch.distributed" not in r.stderr, r.stderr  # no warning about a process group
    ref, got = _losses(one_process), _losses(laptop)
    assert sorted(got) == list(range(1, 7))
    assert max(abs(got[s] - ref[s]) for s in range(4, 7)) <= 1e-5
    assert _max_diff(_weights(laptop, 6), _weights(one_process, 6)) <= 1e-5


@multiprocess
def test_sharded_checkpoint_resumes_on_one_rank(fsdp_two_ranks):
    run, stopped = fsdp_two_ranks
    r = _cli(*FSDP, "--steps", "6", "--save-every", "3", "--out", str(stopped), "--resume",
             nproc=1)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step 3" in r.stdout
    ref, got = _losses(run), _losses(stopped)
    assert sorted(got) == list(range(1, 7))
    assert max(abs(got[s] - ref[s]) for s in range(4, 7)) <= 1e-5
    # and inference and averaging read the run in one process, without torchrun
    r = _cli("translate", "--model", str(stopped), "--quiet", "one two three")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = _cli("average", "--model", str(stopped), "--last", "2")
    assert r.returncode == 0, r.stderr
    averaged = load_file(str(stopped / "final" / "model.safetensors"))
    a, b = _weights(stopped, 3), _weights(stopped, 6)
    assert all(torch.allclose(averaged[k], (a[k] + b[k]) / 2, atol=1e-7) for k in a)


@multiprocess
def test_one_rank_checkpoint_resumes_on_two_ranks(fsdp_two_ranks, tmp_path):
    run, _ = fsdp_two_ranks
    common = [*FSDP, "--steps", "6", "--save-every", "3", "--out", str(tmp_path)]
    r = _cli(*common, nproc=1, env={"ATTNLAB_FAULT": "term@step:3"})
    assert "SIGTERM at step 3" in r.stderr, r.stderr[-3000:]
    r = _cli(*common, "--resume", nproc=2)
    assert r.returncode == 0 and "resumed from step 3" in r.stdout, r.stderr[-3000:]
    ref, got = _losses(run), _losses(tmp_path)
    assert max(abs(got[s] - ref[s]) for s in range(1, 7)) <= 1e-5


@multiprocess
def test_tensor_parallel_training_stops_and_resumes_as_one_process(one_process, tmp_path):
    """--tp 2 alone (sharded matrices beside replicated norms and embeddings, one optimizer
    over both), stopped after step 3 and resumed: each step's loss, and the weights, as one
    process's. (Adam turns float rounding in a near-zero gradient into steps of about lr, so
    the weights are compared within 1e-4.)"""
    common = [*TRAIN, "--steps", "6", "--save-every", "3", "--out", str(tmp_path), "--tp", "2"]
    r = _cli(*common, nproc=2, env={"ATTNLAB_FAULT": "term@step:3"})
    assert "SIGTERM at step 3" in r.stderr, r.stderr[-3000:]
    r = _cli(*common, "--resume", nproc=2)
    assert r.returncode == 0 and "resumed from step 3" in r.stdout, r.stderr[-3000:]
    ref, got = _losses(one_process), _losses(tmp_path)
    assert max(abs(got[s] - ref[s]) for s in range(1, 7)) <= 1e-5
    assert _max_diff(_weights(tmp_path, 6), _weights(one_process, 6)) <= 1e-4


@multiprocess
def test_fsdp_with_tensor_parallel_on_four_processes_equals_one_process(one_process, tmp_path):
    out = tmp_path / "2d"
    evaluated = [a for a in TRAIN if a != "--no-evaluate"]  # and translate after training
    r = _cli(*evaluated, "--steps", "6", "--save-every", "3", "--out", str(out), "--parallel",
             "fsdp", "--tp", "2", nproc=4, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("held-out exact match:") == 1  # rank 0 scores the gathered model
    assert _max_diff(_weights(out, 6), _weights(one_process, 6)) <= 1e-5
    ref, got = _losses(one_process), _losses(out)
    assert max(abs(got[s] - ref[s]) for s in ref) <= 1e-5


@multiprocess
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fsdp_half_precision_with_accumulation_follows_the_unsharded_loss_curve(precision,
                                                                              tmp_path):
    """Half precision under FSDP is its MixedPrecisionPolicy (half compute, fp32 reduction
    and master weights; fp16 with FSDP's sharded gradient scaler); one process runs autocast
    (fp16 with its scaler). Their roundings differ, so the loss curves are compared (within
    0.01 nats a step), not the bits; both accumulate 2 micro-batches."""
    common = [*TRAIN[:-1], precision, "--steps", "6", "--save-every", "100", "--accumulate",
              "2"]
    one = _cli(*common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = _cli(*common, "--out", str(tmp_path / "fsdp"), "--parallel", "fsdp", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    ref, got = _losses(tmp_path / "one"), _losses(tmp_path / "fsdp")
    assert sorted(got) == list(range(1, 7))
    assert max(abs(got[s] - ref[s]) for s in ref) <= 0.01, (ref, got)
    assert ref[6] < ref[1] - 0.3  # both learn: the curve is not flat


@multiprocess
def test_fsdp_early_stopping_keeps_the_gathered_best_model(tmp_path):
    """A ViT on the digits with early stopping: best/ (written during training) and the
    test scores (of best/, after training) are those of one process."""
    common = ["train", "image", "--data", "digits", "--preset", "vit-tiny", "--steps", "4",
              "--eval-every", "2", "--patience", "1", "--no-progress", "--precision", "fp32",
              "--set", "dropout=0.0"]
    one = _cli(*common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = _cli(*common, "--out", str(tmp_path / "fsdp"), "--parallel", "fsdp", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    best = [load_file(str(tmp_path / run / "best" / "model.safetensors"))
            for run in ("one", "fsdp")]
    assert _max_diff(*best) <= 1e-5
    scores = [line for line in two.stdout.splitlines() if line.startswith(("val:", "test:"))]
    assert len(scores) == 2 and all(line in one.stdout for line in scores), two.stdout


TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1"}  # as torchrun sets them; nothing may connect before the check


BAD_FLAGS = [
    (["--tp", "2", "--set", "n_heads=1"], TORCHRUN_ENV,
     "--tp 2: must divide the model's 1 attention heads and 1 kv heads"),
    (["--tp", "2", "--set", "num_kv_heads=1"], TORCHRUN_ENV,
     "--tp 2: must divide the model's 4 attention heads and 1 kv heads"),
    (["--pp", "2"], TORCHRUN_ENV, "--pp 2: only decoder-only and encoder-only language models "
                                  "are pipelined"),
    (["--parallel", "fsdp"], {}, "--parallel fsdp needs several processes: launch with torchrun"),
    (["--microbatches", "4"], {}, "--microbatches needs --pp N"),
    (["--pp", "2", "--compile"], TORCHRUN_ENV, "--pp runs in fp32 or bf16, without --compile"),
    (["--pp", "2", "--parallel", "fsdp"], TORCHRUN_ENV,
     "--pp 2 runs on exactly 2 processes, without --tp, --parallel fsdp"),
    (["--pp", "2", "--pp-schedule", "1f1b", "--microbatches", "1"], TORCHRUN_ENV,
     "the 1f1b schedule needs at least one micro-batch per stage"),
    (["--tp", "2", "--precision", "fp16"], TORCHRUN_ENV,
     "--precision fp16 with --tp needs --parallel fsdp"),
    (["--tp", "3"], {**TORCHRUN_ENV, "WORLD_SIZE": "4"},
     "--world 4 (processes): not divisible by tp·pp = 3·1 = 3"),
]

# Every case in one process of its own (torchrun's variables differ from case to case, and a
# case that wrongly went on to connect must not hang this one): seconds instead of a start-up
# of Python and torch a case.
_DRIVER = """
import contextlib, io, json, os, sys
from attnlab.cli import main
results = []
for argv, env in json.loads(sys.stdin.read()):
    os.environ.update(env)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except Exception:
            import traceback
            traceback.print_exc()
            code = 1
    for key in env:
        del os.environ[key]
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def bad_flag_results(tmp_path_factory) -> list[tuple[int, str]]:
    out = str(tmp_path_factory.mktemp("bad-flags") / "run")
    cases = [([*TRAIN, "--steps", "1", "--out", out, *flags], env)
             for flags, env, _ in BAD_FLAGS]
    done = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(BAD_FLAGS)),
                         ids=[" ".join(flags) for flags, _, _ in BAD_FLAGS])
def test_bad_parallel_flags_are_one_line_and_exit_2(case, bad_flag_results):
    code, stderr = bad_flag_results[case]
    message = BAD_FLAGS[case][2]
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    said = [line for line in stderr.strip().splitlines() if "warning:" not in line]
    assert len(said) == 1, stderr  # (fp16 on a CPU also gets its warning)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    words = "the quick brown fox jumps over a lazy dog and the cat runs far from home".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(len(words), (12,), generator=g))
             for _ in range(300)]
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("\n".join(lines))
    return path


def _lm(text: Path) -> list[str]:
    return ["train", "lm", "--text", str(text), "--preset", "gpt-mini", "--set", "d_model=32",
            "--set", "d_ff=64", "--block", "16", "--batch", "8", "--steps", "6", "--warmup", "2",
            "--save-every", "3", "--eval-every", "3", "--no-progress", "--precision", "fp32"]


@multiprocess
@pytest.mark.parametrize("schedule, precision, accumulate, tolerance", [
    ("gpipe", "fp32", "1", 1e-5), ("1f1b", "fp32", "2", 1e-5), ("gpipe", "bf16", "1", 0.02)])
def test_pipeline_training_equals_one_process(text, schedule, precision, accumulate, tolerance,
                                              tmp_path):
    """GPT-2-style (tied embedding and head across the two stages), 4 layers on 2 stages,
    4 micro-batches, each block checkpointed: the loss, gradient norm, validation and weights
    of every step. bf16 autocast rounds the micro-batches' sums in another order: a looser
    bound, and no comparison of weights (Adam turns rounding into ±lr steps)."""
    common = [*_lm(text)[:-1], precision, "--accumulate", accumulate]
    one = _cli(*common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = _cli(*common, "--out", str(tmp_path / "pp"), "--pp", "2", "--microbatches", "4",
               "--pp-schedule", schedule, "--activation-checkpointing", "block", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    rows = {}
    for name in ("one", "pp"):
        rows[name] = [json.loads(r) for r in (tmp_path / name / "metrics.jsonl").read_text()
                      .splitlines()]
    assert sum("val_loss" in r for r in rows["pp"]) == 2  # validated at steps 3 and 6
    for a, b in zip(rows["one"], rows["pp"], strict=True):
        assert a.keys() == b.keys()
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) <= tolerance, (key, a, b)
    if precision == "fp32":
        assert _max_diff(_weights(tmp_path / "one", 6), _weights(tmp_path / "pp", 6)) <= 1e-5


def test_more_stages_than_layers_is_one_line_and_exit_2(text, tmp_path):
    r = _cli(*_lm(text), "--out", str(tmp_path / "run"), "--pp", "5",
             env={**TORCHRUN_ENV, "WORLD_SIZE": "5"}, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--pp 5: more stages than the model's 4 layers" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
