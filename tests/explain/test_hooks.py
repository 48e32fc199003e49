"""attnlab.explain.hooks: named stages recorded from every family, replaced, and an identity
patch that reproduces the model's output bit for bit."""

import pytest
import torch

from attnlab import ModelConfig
from attnlab.errors import BadInput
from attnlab.explain.hooks import patched, replace_head, stage_names, trace
from attnlab.models import BERT, GPT, Transformer, ViT

SMALL = dict(d_model=32, n_heads=4, d_ff=64, vocab_size=40)


def gpt2():
    return GPT(ModelConfig.from_preset("gpt-mini", n_decoder_layers=2, **SMALL)).eval()


def llama():  # RoPE, RMSNorm, SwiGLU, grouped-query attention
    return GPT(ModelConfig.from_preset("llama-mini", n_decoder_layers=2, num_kv_heads=2,
                                       **SMALL)).eval()


def bert():
    return BERT(ModelConfig.from_preset("bert-tiny", head="mlm", **SMALL)).eval()


def seq2seq():
    return Transformer(ModelConfig.from_preset("tiny", **SMALL)).eval()


def vit():
    return ViT(ModelConfig.from_preset("vit-tiny", n_encoder_layers=2)).eval()


def albert():
    return BERT(ModelConfig.from_preset("bert-tiny", head="mlm", share_layers=True,
                                        **SMALL)).eval()


def inputs(name: str, model) -> tuple:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (1, 7), generator=g)
    if name == "seq2seq":
        return ids, torch.randint(5, 40, (1, 4), generator=g)
    if name == "vit":
        c = model.config
        return (torch.randn(1, c.num_channels, c.image_size, c.image_size, generator=g),)
    return (ids,)


FAMILIES = {"gpt2": gpt2, "llama": llama, "bert": bert, "seq2seq": seq2seq, "vit": vit,
            "albert": albert}


@pytest.fixture(params=list(FAMILIES))
def family(request):
    torch.manual_seed(0)
    model = FAMILIES[request.param]()
    return request.param, model, inputs(request.param, model)


def replay(run, kind: str | None = None):
    """Patches that put the recorded stages of one kind (``in``, ``self_attn.heads``, …;
    default all) back in place of themselves."""
    return {name: (lambda v, name=name: run[name].clone()) for name in run
            if kind is None or name.split(".", 2)[2] == kind}


KINDS = ["in", "self_attn.heads", "self_attn.out", "cross_attn.heads", "cross_attn.out",
         "ffn.out", "out"]


@pytest.mark.parametrize("need_weights", [False, True])
def test_identity_patch_reproduces_the_output_bit_for_bit(family, need_weights):
    """Each kind of stage replayed alone (a later stage put back would hide a change made to an
    earlier one)."""
    _, model, x = family
    run = trace(model, *x, need_weights=need_weights)
    assert len(run) == len(stage_names(model))
    with torch.no_grad():
        plain = model(*x)  # no hooks at all (the fused path where it applies)
    for kind in KINDS:
        patches = replay(run, kind)
        if not patches:
            continue
        with torch.no_grad(), patched(model, patches):
            out = model(*x, need_weights=need_weights)
        assert torch.equal(out, run.output), kind  # the same code path: bit for bit
        torch.testing.assert_close(out, plain, rtol=1e-6, atol=1e-6)  # float32, relative


def test_the_stages_are_what_their_names_say(family):
    """Independent of the hooks' own bookkeeping: W_O applied to ``.heads`` gives ``.out``;
    a layer's output is the next layer's input; pre-LN adds both sublayers to the stream."""
    name, model, x = family
    run = trace(model, *x)
    for stack, layers in [(s, getattr(model, s).layers) for s in ("encoder", "decoder", "blocks")
                          if hasattr(model, s)]:
        for i, layer in enumerate(layers):
            at = f"{stack}.{i}"
            heads = run[f"{at}.self_attn.heads"]
            assert heads.shape[-2:] == (layer.self_attn.n_heads, layer.self_attn.d_k)
            with torch.no_grad():
                out = layer.self_attn.out_proj(heads.flatten(-2))
            torch.testing.assert_close(out, run[f"{at}.self_attn.out"], rtol=0, atol=1e-6)
            if i + 1 < len(layers):
                assert torch.equal(run[f"{at}.out"], run[f"{stack}.{i + 1}.in"])
            if name in ("gpt2", "llama"):  # pre-LN, no dropout in eval: x + attn + ffn
                summed = run[f"{at}.in"] + run[f"{at}.self_attn.out"] + run[f"{at}.ffn.out"]
                torch.testing.assert_close(summed, run[f"{at}.out"], rtol=0, atol=1e-6)
    if name == "bert":  # no final norm: the last layer's output is the encoder's
        with torch.no_grad():
            assert torch.equal(run["encoder.1.out"], model.encode(*x))


def test_shared_layers_are_named_in_turn():
    torch.manual_seed(0)
    model = albert()
    ids = inputs("albert", model)[0]
    run = trace(model, ids)
    assert not torch.equal(run["encoder.0.out"], run["encoder.1.out"])
    assert torch.equal(run["encoder.0.out"], run["encoder.1.in"])


def test_overlapping_patterns_all_apply_on_every_pass():
    """Two patterns naming one stage both apply, in order, on each pass inside the block (not
    one on the first pass and the other on the next)."""
    torch.manual_seed(0)
    model, ids = gpt2(), inputs("gpt2", None)[0]
    double = {"blocks.1.out": lambda h: h * 2, "blocks.*.out": lambda h: h + 1}
    with torch.no_grad():
        plain = trace(model, ids)
        with patched(model, double):
            first, second = model(ids), model(ids)
        expected = model.lm_head(model.blocks.norm(plain["blocks.1.out"] * 2 + 1))
    assert torch.equal(first, second)
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-5)


def test_a_shared_layer_patched_at_one_position_is_patched_there_only():
    """ALBERT runs one layer at every position: a patch of ``encoder.0.out`` changes the first
    call alone. The second layer reads the patched value, and its own output is its post-LN
    norm's (each row's mean 0 with the initial γ = 1, β = 0), not patched as well (mean 1)."""
    torch.manual_seed(0)
    model = albert()
    ids = inputs("albert", model)[0]
    plain = trace(model, ids)
    with torch.no_grad(), patched(model, {"encoder.0.out": lambda h: h + 1}):
        seen = trace(model, ids)
    torch.testing.assert_close(seen["encoder.1.in"], plain["encoder.0.out"] + 1)
    assert seen["encoder.1.out"].mean(-1).abs().max() < 1e-4


def test_a_patch_changes_the_model_as_the_same_change_by_hand():
    """Zeroing head 1 of layer 0 through ``patched`` equals zeroing W_O's columns of that head
    in a copy of the weights."""
    torch.manual_seed(0)
    model, ids = gpt2(), inputs("gpt2", None)[0]
    with torch.no_grad(), patched(model, {"blocks.0.self_attn.heads": replace_head(1)}):
        patched_out = model(ids)
        d_k = model.blocks.layers[0].self_attn.d_k
        w = model.blocks.layers[0].self_attn.out_proj.weight
        saved = w.clone()
    with torch.no_grad():
        w[:, d_k:2 * d_k] = 0
        by_hand = model(ids)
        w.copy_(saved)
        assert not torch.allclose(patched_out, model(ids))
    torch.testing.assert_close(patched_out, by_hand, rtol=0, atol=1e-6)


def test_hooks_are_removed_after_the_block():
    torch.manual_seed(0)
    model, ids = gpt2(), inputs("gpt2", None)[0]
    with torch.no_grad():
        before = model(ids)
        with patched(model, {"blocks.*.ffn.out": torch.zeros_like}):
            assert not torch.equal(model(ids), before)
        assert torch.equal(model(ids), before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_cross_attention_of_the_decoder_is_named():
    torch.manual_seed(0)
    model = seq2seq()
    names = stage_names(model)
    assert "decoder.1.cross_attn.heads" in names and "encoder.1.cross_attn.out" not in names
    assert names.index("encoder.1.out") < names.index("decoder.0.in")


def test_bad_stage_names_and_shapes_are_refused():
    torch.manual_seed(0)
    model, ids = gpt2(), inputs("gpt2", None)[0]
    with pytest.raises(BadInput, match="blocks.9.out"), patched(model, {"blocks.9.out": abs}):
        pass
    with pytest.raises(BadInput, match="shape"), \
            patched(model, {"blocks.0.out": lambda v: v[:, :1]}):
        model(ids)


def test_integer_kernel_layers_are_traced_and_replayed():
    """A 4-bit model prepared for decoding (its linears are kernel subclasses, Q/K/V fused)."""
    from attnlab.cpu import for_decoding
    from attnlab.nn.quantized import quantize

    torch.manual_seed(0)
    model = GPT(ModelConfig.from_preset("llama-mini", n_decoder_layers=2, d_model=64,
                                        n_heads=4, num_kv_heads=2, d_ff=96,
                                        vocab_size=40)).eval()
    quantize(model, bits=4)
    model = for_decoding(model, "cpu", "fp32", integer=True)
    assert type(model.blocks.layers[0].self_attn.out_proj).__module__ != "torch.nn.modules.linear"
    ids = inputs("llama", None)[0]
    run = trace(model, ids)
    assert run["blocks.1.self_attn.heads"].shape[-2:] == (4, 16)
    for kind in ("in", "self_attn.heads", "self_attn.out", "ffn.out", "out"):
        with torch.no_grad(), patched(model, replay(run, kind)):
            assert torch.equal(model(ids), run.output), kind
    with torch.no_grad():
        assert torch.equal(model(ids), run.output)
