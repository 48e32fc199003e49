"""Head ablation against the pruning code, and activation patching against hooks written here
by hand (torch's own forward pre-hooks on W_O, not attnlab.explain.hooks)."""

import copy

import pytest
import torch

from attnlab import ModelConfig
from attnlab.compression.prune import remove_heads
from attnlab.errors import BadInput
from attnlab.explain.interventions import (
    ablate,
    check_same_length,
    format_ablation,
    identity_check,
    parse_heads,
    patch_from,
)
from attnlab.explain.probe import sentence_probe
from attnlab.models import BERT, Transformer
from tests.explain.test_hooks import SMALL
from tests.explain.test_lens import gpt, word_tok


def test_ablation_equals_the_pruned_model():
    model, tok = gpt("gpt-mini"), word_tok()
    probe = sentence_probe(model, tok, "the capital of france is")
    heads = parse_heads("0.1,2.3,2.0", probe)
    done = ablate(probe, heads)
    pruned = copy.deepcopy(model)
    remove_heads(pruned, {"blocks.layers.0.self_attn": [1], "blocks.layers.2.self_attn": [0, 3]})
    expected = probe.forward(pruned)
    torch.testing.assert_close(done.after, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(done.after, done.before, atol=1e-6)  # the heads did something
    assert done.check is not None and done.check.ok
    assert done.chosen == int(model(torch.tensor([tok.encode("the capital of france is")]))
                              [0, -1].argmax())
    text = format_ablation(probe, done)
    assert f"{float(done.after[-1].softmax(-1)[done.chosen]):.4f}" in text


def test_ablation_of_cross_attention_equals_the_pruned_model():
    torch.manual_seed(0)
    tok = word_tok()
    model = Transformer(ModelConfig.from_preset("tiny", **SMALL)).eval()
    probe = sentence_probe(model, tok, "paris is the capital", target="rome is")
    done = ablate(probe, parse_heads("cross.1.2,encoder.0.0", probe))
    pruned = copy.deepcopy(model)
    remove_heads(pruned, {"decoder.layers.1.cross_attn": [2], "encoder.layers.0.self_attn": [0]})
    torch.testing.assert_close(done.after, probe.forward(pruned), rtol=0, atol=1e-6)
    assert done.check.ok


def test_ablation_of_bert_and_of_grouped_query_heads():
    torch.manual_seed(0)
    from attnlab.tokenizers import WordPieceTokenizer

    tok = WordPieceTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
        "paris", "is", "the", "capital", "of", "france"])
    model = BERT(ModelConfig.from_preset("bert-tiny", head="mlm", **{**SMALL, "vocab_size":
                                                                     tok.vocab_size})).eval()
    probe = sentence_probe(model, tok, "paris is the [MASK] of france")
    done = ablate(probe, parse_heads("1.1", probe))
    assert done.check.ok
    llama = gpt("llama-mini")  # 4 query heads share 2 key/value heads: pruning refuses
    probe = sentence_probe(llama, word_tok(), "the capital of france")
    done = ablate(probe, parse_heads("0.1", probe))
    assert done.check is None and "key/value" in done.note


@pytest.mark.parametrize("spec, words", [("3.0", "no layer 3"), ("0.4", "no head 4"),
                                         ("1", "L.H"), ("cross.0.0", "no decoder"),
                                         ("a.b", "L.H")])
def test_heads_that_do_not_exist_are_refused(spec, words):
    probe = sentence_probe(gpt("gpt-mini"), word_tok(), "the capital")
    with pytest.raises(BadInput, match=words):
        parse_heads(spec, probe)


def by_hand(model, probe, layer: int, head: int, other_heads: torch.Tensor) -> torch.Tensor:
    """The main run with head ``head`` of ``layer`` taken from ``other_heads`` (W_O's input in
    the other run), by a pre-hook on W_O registered here."""
    attention = model.blocks.layers[layer].self_attn
    d_k = attention.d_k

    def swap(module, args):
        x = args[0].clone()
        x[..., head * d_k:(head + 1) * d_k] = other_heads[..., head * d_k:(head + 1) * d_k]
        return (x,)

    handle = attention.out_proj.register_forward_pre_hook(swap)
    try:
        return probe.forward()[-1]
    finally:
        handle.remove()


def recorded_inputs(model, probe) -> list[torch.Tensor]:
    seen = []
    handles = [layer.self_attn.out_proj.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].clone())) for layer in model.blocks.layers]
    try:
        probe.forward()
    finally:
        for h in handles:
            h.remove()
    return seen


def test_patching_against_hooks_by_hand():
    model, tok = gpt("gpt-mini"), word_tok()
    main = sentence_probe(model, tok, "the capital of france is")
    other = sentence_probe(model, tok, "rome is the capital of")
    table = patch_from(main, other)
    base, theirs = main.forward()[-1], other.forward()[-1]
    a, b = int(base.argmax()), int(theirs.argmax())
    assert (table.main_token, table.other_token) == (a, b) and a != b
    d_main, d_other = float(base[b] - base[a]), float(theirs[b] - theirs[a])
    inputs = recorded_inputs(model, other)
    for layer in range(3):
        for head in range(4):
            out = by_hand(model, main, layer, head, inputs[layer])
            expected = (float(out[b] - out[a]) - d_main) / (d_other - d_main)
            assert float(table.effect[layer, head]) == pytest.approx(expected, abs=1e-5)
    assert table.rows == ["0", "1", "2"]


def test_patching_needs_the_same_length_and_a_difference_to_carry():
    model, tok = gpt("gpt-mini"), word_tok()
    main = sentence_probe(model, tok, "the capital of france is")
    with pytest.raises(BadInput, match="--patch-from.*4 tokens.*5"):
        check_same_length(main, sentence_probe(model, tok, "rome is the capital"))
    with pytest.raises(BadInput, match="same logit difference"):
        patch_from(main, sentence_probe(model, tok, "the capital of france is"))


def test_where_both_runs_predict_one_token_the_contrast_is_the_others_runner_up():
    """Both sentences' top token is a: b is the other run's second, and the effect of each head
    is still (D_patched − D_main) / (D_other − D_main) with D = logit_b − logit_a."""
    model, tok = gpt("gpt-mini"), word_tok()
    main = sentence_probe(model, tok, "the capital of france is")
    for words in ("the capital of rome is", "a capital of france is", "the city of france is"):
        other = sentence_probe(model, tok, words)
        a = int(main.forward()[-1].argmax())
        theirs = other.forward()[-1]
        if int(theirs.argmax()) == a:
            break
    else:
        pytest.skip("no sentence here predicts the main one's token")
    table = patch_from(main, other)
    b = int(theirs.topk(2).indices[1])
    assert table.same_top and (table.main_token, table.other_token) == (a, b)
    assert table.other_diff == pytest.approx(float(theirs[b] - theirs[a]), abs=1e-6)


def test_identity_check_is_bit_for_bit():
    model, tok = gpt("llama-mini"), word_tok()
    check = identity_check(sentence_probe(model, tok, "the capital of france is"))
    assert check.ok and check.error == 0.0
