"""Encoder-only BERT: parameter counts per head, MLM tying, bidirectionality, padding masks,
fully masked rows, token types, dropout in eval, gradients against finite differences."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import BERT, GPT, ModelConfig, build_model, count_parameters
from tests.gradients import directional_derivatives

VOCAB, D = 100, 128  # bert-tiny's width, a small vocabulary (the tests never need 30522)
HEADS = ["none", "mlm", "pretraining", "classify", "tokens"]


def tiny(head="none", **overrides):
    torch.manual_seed(0)
    config = ModelConfig.from_preset("bert-tiny", vocab_size=VOCAB, dropout=0.0,
                                     attention_dropout=0.0, head=head, **overrides)
    return BERT(config).eval()


def bert_count(vocab, d, ff, n, max_len=512, types=2, head="none", labels=2):
    """BERT by formula: token, position and segment tables plus a LayerNorm (2d) on their sum;
    per layer attention 4(d² + d), FFN 2·d·ff + ff + d, two LayerNorms 2·2d. Heads: pooler
    d² + d; MLM transform d² + d, its LayerNorm 2d and a per-token bias (its output matrix is
    the token table, tied); NSP 2(d + 1); classifier labels·(d + 1)."""
    total = vocab * d + max_len * d + types * d + 2 * d
    total += n * (4 * (d * d + d) + 2 * d * ff + ff + d + 2 * 2 * d)
    pooler, mlm = d * d + d, d * d + d + 2 * d + vocab
    total += {"none": pooler, "mlm": mlm, "pretraining": pooler + mlm + 2 * (d + 1),
              "classify": pooler + labels * (d + 1), "tokens": labels * (d + 1)}[head]
    return total


@pytest.mark.parametrize("preset, head, exact, expected", [
    ("bert-base", "none", 109_482_240, bert_count(30522, 768, 3072, 12)),  # "110M"
    ("bert-large", "none", 335_141_888, bert_count(30522, 1024, 4096, 24)),  # "340M"
    *[("bert-tiny", h, None, bert_count(30522, 128, 512, 2, head=h)) for h in HEADS],
])
def test_parameter_counts_equal_the_formula(preset, head, exact, expected):
    with torch.device("meta"):  # shapes are all we count
        model = build_model(ModelConfig.from_preset(preset, head=head))
    assert isinstance(model, BERT)
    assert count_parameters(model) == expected
    if exact is not None:  # the published BertModel sizes
        assert expected == exact


def test_parameter_count_without_segments_and_with_more_labels():
    with torch.device("meta"):
        model = BERT(ModelConfig.from_preset("bert-mini", type_vocab_size=0, head="classify",
                                             num_labels=5))
    expected = bert_count(30522, 256, 1024, 4, types=0, head="classify", labels=5)
    assert count_parameters(model) == expected


@pytest.mark.parametrize("head", ["mlm", "pretraining"])
def test_mlm_output_matrix_is_the_input_embedding(head):
    """Tokens 50..99 never occur in the input, yet their embedding rows get gradient from an
    MLM loss: the output projection is the same tensor. Without an MLM head they get none."""
    ids = torch.randint(0, 50, (2, 9))
    model = tiny(head)
    out = model(ids)
    logits = out[0] if head == "pretraining" else out
    F.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1)).backward()
    assert model.embed.weight.grad[50:].abs().amax(dim=1).min() > 0  # every unseen row
    bare = tiny("none")
    bare(ids).square().sum().backward()
    unseen = bare.embed.weight.grad[50:]
    assert torch.equal(unseen, torch.zeros_like(unseen))


def test_every_position_sees_every_other():
    """Bidirectional: changing token t changes the vectors at every position, before t too;
    hiding t with the attention mask makes the change invisible everywhere else."""
    model = tiny()
    ids = torch.randint(0, VOCAB, (2, 10))
    changed = ids.clone()
    changed[:, 6] = (ids[:, 6] + 1) % VOCAB
    mask = torch.ones_like(ids)
    mask[:, 6] = 0
    with torch.no_grad():
        h = model(ids)
        assert h.shape == (2, 10, D)
        assert (model(changed) - h).abs().amax(dim=-1).min() > 1e-4
        hidden = model(ids, attention_mask=mask)
        diff = (model(changed, attention_mask=mask) - hidden).abs().amax(dim=-1)
    others = torch.arange(10) != 6
    assert diff[:, others].max() <= 1e-5  # the same arithmetic on the same numbers
    assert diff[:, 6].min() > 1e-4  # token 6's own vector still reads token 6


@pytest.mark.parametrize("head", HEADS)
def test_right_padding_with_the_mask_changes_no_output(head):
    """Row 0 is 6 real tokens and 5 pads of arbitrary ids, row 1 all real; every head's output
    at the real positions (or, pooled, for the row) equals the row run alone."""
    model = tiny(head)
    ids = torch.randint(0, VOCAB, (2, 11))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0

    def outputs(*args, **kw):
        out = model(*args, **kw)
        return list(out) if isinstance(out, tuple) else [out]

    with torch.no_grad():
        batched = outputs(ids, attention_mask=mask)
        alone = [outputs(ids[:1, :6]), outputs(ids[1:])]
        unmasked = outputs(ids)
    per_token = head in ("none", "mlm", "pretraining", "tokens")
    for i, b in enumerate(batched):
        assert torch.isfinite(b).all()
        tokenwise = per_token and i == 0  # pretraining: (mlm per token, nsp per row)
        real0 = b[0, :6] if tokenwise else b[0]
        assert (real0 - alone[0][i][0]).abs().max() <= 1e-5
        assert (b[1] - alone[1][i][0]).abs().max() <= 1e-5
        # Without the mask the pads are read as text and row 0 changes: the mask does the work.
        assert ((unmasked[i][0, :6] if tokenwise else unmasked[i][0]) - real0).abs().max() > 1e-4


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_fully_masked_row_is_finite_and_leaves_the_others_alone(need_weights):
    """A row with attention_mask all zeros has no key to attend to: its outputs and every
    gradient stay finite (no 0/0 softmax), and the other row is unchanged."""
    model = tiny("classify")
    ids = torch.randint(0, VOCAB, (2, 7))
    mask = torch.ones_like(ids)
    mask[0] = 0
    hidden = model.encode(ids, attention_mask=mask, need_weights=need_weights)
    logits = model(ids, attention_mask=mask, need_weights=need_weights)
    assert torch.isfinite(hidden).all() and torch.isfinite(logits).all()
    (hidden.square().sum() + logits.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        assert (hidden[1] - model.encode(ids[1:])[0]).abs().max() <= 1e-5
        assert (logits[1] - model(ids[1:])[0]).abs().max() <= 1e-5


def test_explicit_attention_path_gives_the_fused_result():
    """need_weights=True writes softmax(QKᵀ/√d_k)·V out; the default calls torch's fused
    kernel. Same equation, so the same vectors up to float32 rounding."""
    model = tiny()
    ids = torch.randint(0, VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        for m in (None, mask):
            fused = model(ids, attention_mask=m)
            assert (fused - model(ids, attention_mask=m, need_weights=True)).abs().max() <= 1e-5


def test_token_types_default_to_sentence_a_and_matter():
    model = tiny()
    ids = torch.randint(0, VOCAB, (2, 8))
    types = torch.zeros_like(ids)
    with torch.no_grad():
        default = model(ids)
        assert torch.equal(default, model(ids, token_type_ids=types))
        types[:, 4:] = 1  # sentence B
        assert (model(ids, token_type_ids=types) - default).abs().amax(dim=-1).min() > 1e-4


@pytest.mark.parametrize("head", ["mlm", "pretraining"])
def test_masked_positions_select_the_same_logits(head):
    """Projecting only the selected positions to the vocabulary gives the rows of the full
    projection at those positions."""
    model = tiny(head)
    ids = torch.randint(0, VOCAB, (3, 10))
    selected = torch.rand(3, 10) < 0.3
    with torch.no_grad():
        full, part = model(ids), model(ids, masked_positions=selected)
    if head == "pretraining":
        assert torch.equal(full[1], part[1])  # NSP reads the whole sequence either way
        full, part = full[0], part[0]
    assert part.shape == (int(selected.sum()), VOCAB)
    assert (part - full[selected]).abs().max() <= 1e-5


def test_eval_mode_turns_every_dropout_off():
    """bert-tiny has dropout 0.1 on embeddings, sublayers and attention weights. In train mode
    two calls differ; in eval mode the output equals a dropout-free copy's exactly (dropout
    is the identity, the rest is the same arithmetic)."""
    torch.manual_seed(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", vocab_size=VOCAB, head="classify"))
    clean = tiny("classify")
    clean.load_state_dict(model.state_dict())
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        model.train()
        assert not torch.equal(model.encode(ids), model.encode(ids))
        model.eval()
        assert torch.equal(model.encode(ids), clean.encode(ids))
        assert torch.equal(model(ids), clean(ids))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"513 tokens exceeds the model's (context )?max_len=512"):
        tiny()(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match="BERT needs arch='encoder', got 'decoder'"):
        BERT(ModelConfig.from_preset("gpt-mini"))
    with pytest.raises(ValueError, match="activation='swiglu' is not supported by BERT"):
        BERT(ModelConfig.from_preset("bert-tiny", activation="swiglu"))
    assert isinstance(build_model(ModelConfig.from_preset("gpt-mini")), GPT)
    tagger = tiny("tokens")
    with pytest.raises(ValueError, match="head='tokens' has no pooler"):
        tagger.pool(tagger.encode(torch.zeros(1, 3, dtype=torch.long)))


def test_gradient_matches_finite_differences():
    """In float64, along a random direction u of all parameters, the autograd directional
    derivative ∇L·u equals (L(θ + εu) − L(θ − εu)) / 2ε for a classification loss over a batch
    with right padding and a fully masked row. The relative error was measured at 1.5e-8 with
    ε = 1e-6 (O(ε²) truncation: 1.5e-4 at ε = 1e-4; plus rounding ≈ 1e-16/ε); a wrong or
    missing gradient errs by far more than the 1e-6 bound."""
    model = tiny("classify", d_model=32, n_heads=4, d_ff=64, num_labels=3).double()
    ids = torch.randint(0, VOCAB, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    mask[2] = 0
    labels = torch.tensor([0, 2, 1])
    types = torch.zeros_like(ids)
    types[:, 3:] = 1

    def loss():
        return F.cross_entropy(model(ids, types, attention_mask=mask), labels)

    analytic, numeric = directional_derivatives(loss, list(model.parameters()))
    assert abs(analytic - numeric) <= 1e-6 * abs(analytic)


def test_masked_lm_training_step_reduces_loss():
    """Masked-LM loss on one fixed batch (15% of positions replaced by id 4, as [MASK])."""
    torch.manual_seed(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", vocab_size=VOCAB, head="mlm",
                                         dropout=0.0, attention_dropout=0.0))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.randint(5, VOCAB, (8, 16))
    selected = torch.rand(8, 16) < 0.15
    inputs = ids.masked_fill(selected, 4)
    losses = []
    for _ in range(30):
        logits = model(inputs, masked_positions=selected)
        loss = F.cross_entropy(logits, ids[selected])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # measured 0.005x (4.66 -> 0.02)
