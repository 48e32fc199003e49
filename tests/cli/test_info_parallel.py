"""``attnlab info --parallel`` and :func:`attnlab.placement.parallel_memory`: per-rank parameter,
gradient and Adam memory under DDP, FSDP, TP, PP and the FSDP × TP mesh, against counts made
here by hand from a tiny config's shapes, and the one-line errors for layouts that cannot run.

The tiny models: GPT-2's layout (fused qkv with biases, learned positions, LayerNorm, tied
head), 2 layers, d = 32, h = 4 (d_k = 8), d_ff = 128, a vocabulary of 50, 16 positions; and
Llama's (q, k, v apart with 2 kv heads, no biases, RMSNorm, SwiGLU's w1/w3/w2, untied head).
"""

from __future__ import annotations

import re

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.build import count_parameters
from attnlab.errors import BadInput
from attnlab.placement import parallel_memory, parallel_rows, tp_split
from tests.cli.helpers import assert_bad_input, cli

V, D, H, DK, FF, L, T = 50, 32, 4, 8, 128, 2, 16
GPT = dict(vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_decoder_layers=L, max_len=T)
GPT_SET = [a for k, v in GPT.items() for a in ("--set", f"{k}={v}")]
KV, LLAMA_FF = 2, 64
LLAMA = dict(vocab_size=V, d_model=D, n_heads=H, num_kv_heads=KV, d_ff=LLAMA_FF,
             n_decoder_layers=L, max_len=T, tie_embeddings=False)


def meta_model(preset: str, **overrides):
    with torch.device("meta"):
        return build_model(ModelConfig.from_preset(preset, **overrides))


@pytest.fixture(scope="module")
def gpt():
    return meta_model("gpt-mini", **GPT)


@pytest.fixture(scope="module")
def llama():
    return meta_model("llama-mini", **LLAMA)


# --- the GPT, counted by hand ------------------------------------------------------------------
EMBED = V * D + T * D  # tokens + learned positions (the tied head is the token matrix)
LAYER = ((3 * D * D + 3 * D)  # fused qkv and its bias
         + (D * D + D)  # attention output
         + 2 * 2 * D  # two LayerNorms, weight and bias
         + (FF * D + FF) + (D * FF + D))  # w1, w2
FINAL = 2 * D  # the final LayerNorm
M = EMBED + L * LAYER + FINAL


def gpt_tp_layer(tp: int) -> int:
    """One layer's share on a TP rank: h/tp heads of q, k, v (rows, with their bias) and of the
    output (columns; its bias whole); d_ff/tp units of w1 (rows + bias) and w2 (columns; its
    bias whole); the norms whole."""
    heads = H // tp
    qkv = 3 * heads * DK * D + 3 * heads * DK
    out = D * heads * DK + D
    ffn = (FF // tp) * D + FF // tp + D * (FF // tp) + D
    return qkv + out + 2 * 2 * D + ffn


def test_single_process_is_the_models_count_at_16_bytes_a_parameter(gpt):
    assert M == count_parameters(gpt) == 27_584
    r = parallel_memory(gpt, world=1)
    assert (r.layout, r.numel) == ("single process", M)
    assert (r.parameters, r.gradients, r.optimizer, r.total) == (4 * M, 4 * M, 8 * M, 16 * M)
    half = parallel_memory(gpt, world=1, param_bytes=2)  # bf16 weights and grads, fp32 moments
    assert (half.parameters, half.gradients, half.optimizer) == (2 * M, 2 * M, 8 * M)


def test_ddp_replicates_and_fsdp_shards_m_over_n(gpt):
    assert parallel_memory(gpt, world=4, strategy="ddp").numel == M
    # every tensor's first dimension (50, 16, 96, 32, 128) is even: exactly M/2
    assert parallel_memory(gpt, world=2, strategy="fsdp").numel == M // 2
    # N = 4: the 50 vocabulary rows do not divide; the rank holds ⌈50/4⌉ = 13 of them (padded)
    four = parallel_memory(gpt, world=4, strategy="fsdp")
    assert four.numel == (M - V * D) // 4 + 13 * D
    assert four.total == 16 * four.numel


def test_tp_holds_h_over_n_heads_and_the_ffn_share(gpt):
    r = parallel_memory(gpt, world=2, tp=2)
    assert gpt_tp_layer(2) == 6_448  # 1584 (qkv) + 544 (out) + 128 (norms) + 4192 (ffn)
    assert r.numel == EMBED + L * gpt_tp_layer(2) + FINAL == 15_072
    assert parallel_memory(gpt, world=4, tp=4).numel == EMBED + L * gpt_tp_layer(4) + FINAL
    # TP 2 with DDP over the other two ranks holds the same per rank
    assert parallel_memory(gpt, world=4, tp=2).numel == r.numel


def test_tp_of_llama_splits_q_k_v_by_heads_and_w1_w3_w2():
    model = meta_model("llama-mini", **LLAMA)
    layer = D * D + 2 * KV * DK * D + D * D + 2 * D + 3 * LLAMA_FF * D  # q, k, v, o, 2 norms, ffn
    assert count_parameters(model) == 2 * V * D + L * layer + D  # untied head
    local = (H // 2) * DK * D + 2 * (KV // 2) * DK * D + D * (H // 2) * DK + 2 * D \
        + 3 * (LLAMA_FF // 2) * D
    assert parallel_memory(model, world=2, tp=2).numel == 2 * V * D + L * local + D
    assert local == 4_672


def test_pp_reports_the_largest_stage(gpt, llama):
    # ⌈2/2⌉ = 1 layer a stage: stage 0 the embeddings, stage 1 the final norm and the head,
    # whose weight is the token embedding's, so that stage holds its own copy
    r = parallel_memory(gpt, world=2, pp=2)
    assert (r.stage, r.numel) == (0, EMBED + LAYER)
    assert EMBED + LAYER > LAYER + FINAL + V * D
    # the untied Llama: stage 1 (layer, RMSNorm, head) is larger than stage 0 (tokens, layer)
    layer = count_parameters(llama.blocks.layers[0])
    r = parallel_memory(llama, world=2, pp=2)
    assert (r.stage, r.numel) == (1, layer + D + V * D)
    # 3 layers on 2 stages: ⌈3/2⌉ = 2 layers on stage 0
    three = meta_model("gpt-mini", **{**GPT, "n_decoder_layers": 3})
    assert parallel_memory(three, world=2, pp=2).numel == EMBED + 2 * LAYER


def test_fsdp_times_tp_divides_the_tp_share_by_dp(gpt):
    rows, notes = parallel_rows(gpt, 4, tp=2)
    by_layout = {r.layout: r for r in rows}
    assert list(by_layout) == ["single process", "DDP 4", "FSDP 4", "TP 2",
                               "FSDP 2 × TP 2"]  # PP 4: more stages than layers
    assert [r.world for r in rows] == [1, 4, 4, 2, 4]
    mesh = by_layout["FSDP 2 × TP 2"]
    assert (mesh.dp, mesh.tp, mesh.pp) == (2, 2, 1)
    # every TP piece's first dimension (25 of 50, 16, 48, 32, 64) is even
    assert mesh.numel == by_layout["TP 2"].numel // 2 == 15_072 // 2
    assert notes == ["PP 4 not shown: more stages than the model's 2 layers (each stage holds "
                     "at least one)"]
    # without --tp the mesh takes the largest tp below the world that divides it and the heads
    rows, notes = parallel_rows(gpt, 8)
    assert [r.layout for r in rows] == ["single process", "DDP 8", "FSDP 8", "FSDP 2 × TP 4"]
    assert [n.split(":")[0] for n in notes] == ["TP 8 not shown", "PP 8 not shown"]


def test_tied_and_shared_weights_count_once_per_rank(gpt):
    albert = meta_model("albert-base")  # one layer's weights applied 12 times
    assert parallel_memory(albert, world=1).numel == count_parameters(albert) == \
        count_parameters(albert.encoder.layers[0]) + sum(
            p.numel() for n, p in albert.named_parameters() if ".layers." not in n)
    assert parallel_memory(albert, world=2, tp=2).numel < count_parameters(albert)
    with pytest.raises(BadInput, match="--pp 3: layers that share one set of weights"):
        parallel_memory(albert, world=3, pp=3)  # the pipeline does not split shared layers
    # the tied head: once in one process; on a pipeline, the last stage holds its own copy
    # (RoPE: no position table, so that stage, with the final norm, is the larger one)
    rope = meta_model("gpt-mini", **GPT, positional="rope")
    assert parallel_memory(rope, world=1).numel == M - T * D
    r = parallel_memory(rope, world=2, pp=2)
    assert (r.stage, r.numel) == (1, LAYER + FINAL + V * D)


def test_the_split_of_each_parameter_by_name():
    t5 = meta_model("t5-small")  # the encoder–decoder: cross-attention is split as well
    splits = {n: tp_split(n) for n, _ in t5.named_parameters()}
    assert splits["decoder.layers.5.cross_attn.k_proj.weight"] == "column"
    assert splits["decoder.layers.5.cross_attn.out_proj.weight"] == "row"
    assert splits["encoder.layers.0.ffn.w2.weight"] == "row"
    # T5's relative-bias table (buckets, heads): each rank keeps its heads' columns, as
    # apply_tensor_parallel splits it
    assert splits["positional.embedding.weight"] == "row"
    assert splits["tgt_positional.embedding.weight"] == "row"
    assert splits["encoder.norm.weight"] == "replicated"
    assert {tp_split("blocks.layers.0.self_attn.out_proj.bias"),
            tp_split("blocks.layers.0.ffn.w2.bias"),
            tp_split("blocks.layers.0.attn_sublayer.norm.weight")} == {"replicated"}
    assert tp_split("blocks.layers.0.ffn.w1.bias") == "column"
    assert tp_split("blocks.layers.0.ffn.w3.weight") == "column"
    assert tp_split("lm_head.weight") == "replicated"


@pytest.mark.parametrize("kwargs, named", [
    (dict(world=2, tp=3), "--tp 3"),
    (dict(world=4, tp=4, preset="llama"), "--tp 4"),  # kv heads 2 with the Llama override
    (dict(world=3, pp=3), "--pp 3"),
    (dict(world=6, tp=4), "--world 6"),
    (dict(world=2, strategy="zero"), "--parallel zero"),
    (dict(world=2, pp=2, preset="vit-tiny"), "--pp 2"),
], ids=["tp-heads", "tp-kv-heads", "pp-layers", "world", "strategy", "pp-vision"])
def test_layouts_that_cannot_run_raise_bad_input(gpt, llama, kwargs, named):
    preset = kwargs.pop("preset", None)
    model = {None: gpt, "llama": llama}.get(preset) or meta_model(preset or "")
    with pytest.raises(BadInput, match=re.escape(named)) as e:
        parallel_memory(model, **kwargs)
    assert "\n" not in str(e.value)


# --- the command line -----------------------------------------------------------------------
def table(out: str) -> dict[str, list[str]]:
    """The table's rows: layout -> [params/rank, parameters, gradients, optimizer, per rank,
    vs 1 process]."""
    body = out.split("\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in body)}


def test_cli_prints_a_row_per_layout_with_the_hand_counted_numbers(capsys):
    r = cli(capsys, "info", "--parallel", "--preset", "gpt-mini", *GPT_SET, "--world", "4",
            "--tp", "2", "--pp", "2", "--microbatches", "6")
    assert r.code == 0 and r.err == "", r.err
    rows = table(r.out)
    assert list(rows) == ["single process", "DDP 4", "FSDP 4", "TP 2", "PP 2", "FSDP 2 × TP 2"]
    assert [v[0] for v in rows.values()] == ["1", "4", "4", "2", "2", "4"]  # ranks
    expected = {"single process": M, "DDP 4": M, "FSDP 4": (M - V * D) // 4 + 13 * D,
                "TP 2": 15_072, "PP 2": EMBED + LAYER, "FSDP 2 × TP 2": 15_072 // 2}
    assert {k: int(v[1].replace(",", "")) for k, v in rows.items()} == expected
    assert rows["single process"][2:] == ["107.8 KiB", "107.8 KiB", "215.5 KiB", "431.0 KiB",
                                          "1.000"]
    assert rows["TP 2"][-1] == f"{15_072 / M:.3f}"
    for line in ("h/N = 4/2 = 2 head(s) (kv 2) per rank", "FFN d_ff/N = 128/2 = 64 units",
                 "⌈L/N⌉ = ⌈2/2⌉ = 1 layer(s) per stage", "B/(B+N−1) = 6/7 = 85.7%",
                 "dp = world/tp = 4/2 = 2", "M/N per rank"):
        assert line in r.out, line


def test_cli_defaults_to_world_2_and_leaves_out_what_does_not_fit(capsys):
    r = cli(capsys, "info", "--parallel", "--preset", "llama")  # 9 heads, 3 kv heads
    assert r.code == 0 and r.err == "", r.err
    assert list(table(r.out)) == ["single process", "DDP 2", "FSDP 2", "PP 2"]
    assert "TP 2 not shown: must divide the model's 9 attention heads and 3 kv heads" in r.out
    assert "B/(B+N−1) = 4/5 = 80.0% for B = 4 micro-batches (--microbatches B)" in r.out


def test_info_without_parallel_is_unchanged(capsys):
    r = cli(capsys, "info", "--preset", "gpt-mini")
    assert r.code == 0 and r.out.startswith("preset gpt-mini\n  architecture")
    assert "per rank" not in r.out


@pytest.mark.parametrize("args, names", [
    (["--tp", "3"], ["--tp 3", "4 attention heads"]),
    (["--pp", "3"], ["--pp 3", "2 layers"]),
    (["--world", "6", "--tp", "4"], ["--world 6", "tp·pp = 4·1 = 4"]),
    (["--tp", "0"], ["--tp 0", ">= 1"]),
    (["--microbatches", "0"], ["--microbatches 0"]),
    (["--preset", "tiny", "--pp", "2"], ["--pp 2", "encoder-decoder"]),
], ids=["tp-not-dividing-heads", "pp-over-layers", "world-not-divisible", "tp-zero",
        "microbatches-zero", "pp-encoder-decoder"])
def test_cli_bad_layouts_are_one_line_exit_2(capsys, args, names):
    preset = [] if "--preset" in args else ["--preset", "gpt-mini", *GPT_SET]
    r = cli(capsys, "info", "--parallel", *preset, *args)
    assert_bad_input(r, *names)
    assert r.out == ""


def test_cli_parallel_flags_need_parallel(capsys):
    assert_bad_input(cli(capsys, "info", "--preset", "gpt-mini", "--tp", "2"), "--tp",
                     "--parallel")
    assert_bad_input(cli(capsys, "info", "--parallel", "--hardware"), "--parallel",
                     "--hardware")
