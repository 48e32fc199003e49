"""Decoder-only GPT (GPT-2 and Llama shapes): parameter counts, tying, causality, left padding,
KV cache, fully masked rows, position handling, gradients against finite differences."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import BERT, GPT, ModelConfig, build_model, count_parameters
from tests.gradients import directional_derivatives

# The three ways position enters a decoder: learned table (GPT-2), RoPE (Llama), ALiBi bias.
FAMILIES = {
    "learned": ("gpt-mini", {}),
    "rope": ("llama-mini", {}),
    "alibi": ("gpt-mini", {"positional": "alibi"}),
}
VOCAB = 256  # both mini presets


def mini(kind, **overrides):
    preset, extra = FAMILIES[kind]
    torch.manual_seed(0)
    return GPT(ModelConfig.from_preset(preset, dropout=0.0, **{**extra, **overrides})).eval()


def gpt2_count(vocab, d, ff, n, max_len):
    """GPT-2 by formula: token and position tables; per block attention 4(d² + d) (the fused
    QKV is 3(d² + d), the output projection d² + d), two LayerNorms 2·2d, FFN 2·d·ff + ff + d;
    a final LayerNorm 2d; the LM head is the token table (tied)."""
    block = 4 * (d * d + d) + 2 * 2 * d + 2 * d * ff + ff + d
    return vocab * d + max_len * d + n * block + 2 * d


def llama_count(vocab, d, heads, kv_heads, ff, n):
    """Llama by formula, no biases: Q and O are d × d, K and V d × (kv_heads · d_k) each
    (grouped-query attention), SwiGLU 3·d·ff, two RMSNorm gains d each; a final RMSNorm d;
    tied LM head."""
    kv = kv_heads * (d // heads)
    block = 2 * d * d + 2 * d * kv + 3 * d * ff + 2 * d
    return vocab * d + n * block + d


@pytest.mark.parametrize("preset, exact, expected", [
    ("gpt2", 124_439_808, gpt2_count(50257, 768, 3072, 12, 1024)),  # GPT-2 small, "124M"
    ("llama", 134_515_008, llama_count(49152, 576, 9, 3, 1536, 30)),  # SmolLM2-135M
    ("gpt-mini", None, gpt2_count(256, 128, 512, 4, 256)),
    ("llama-mini", None, llama_count(256, 128, 4, 2, 344, 4)),
])
def test_parameter_counts_equal_the_formula(preset, exact, expected):
    with torch.device("meta"):  # shapes are all we count
        model = build_model(ModelConfig.from_preset(preset))
    assert isinstance(model, GPT)
    assert count_parameters(model) == expected
    if exact is not None:  # the published models' sizes
        assert expected == exact


def test_tied_head_is_the_embedding_and_learns_through_both_uses():
    """Tied: one tensor, so the gradient of embedding rows never seen in the input is not zero
    (it comes from the output projection). Untied: those rows get exactly zero gradient, and
    the separate head adds vocab × d parameters."""
    ids = torch.randint(0, 128, (2, 9))  # tokens 128..255 never enter through the embedding
    for tie in (True, False):
        model = mini("learned", tie_embeddings=tie)
        logits = model(ids)
        F.cross_entropy(logits.reshape(-1, VOCAB), ids.roll(-1, 1).reshape(-1)).backward()
        unseen = model.embed.weight.grad[128:]
        assert model.lm_head.weight.grad[128:].abs().sum() > 0
        if tie:
            assert model.lm_head.weight is model.embed.weight
            assert model.lm_head.weight.data_ptr() == model.embed.weight.data_ptr()
            assert unseen.abs().sum() > 0
            tied_count = count_parameters(model)
        else:
            assert model.lm_head.weight.data_ptr() != model.embed.weight.data_ptr()
            assert torch.equal(unseen, torch.zeros_like(unseen))
            assert count_parameters(model) == tied_count + VOCAB * 128


@pytest.mark.parametrize("kind", FAMILIES)
def test_changing_token_t_changes_no_logits_before_t(kind):
    model = mini(kind)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        logits = model(ids)
        assert logits.shape == (2, 12, VOCAB)
        for t in (0, 5, 11):
            changed = ids.clone()
            changed[:, t] = (ids[:, t] + 1 + torch.randint(0, VOCAB - 1, (2,))) % VOCAB
            other = model(changed)
            # Earlier rows are the same arithmetic on the same numbers: 1e-5 is rounding slack.
            assert t == 0 or (other[:, :t] - logits[:, :t]).abs().max() <= 1e-5
            # ...and the change is seen from t on (so the model is not constant in the input).
            assert (other[:, t:] - logits[:, t:]).abs().amax(dim=-1).min() > 1e-4


@pytest.mark.parametrize("kind", FAMILIES)
def test_explicit_attention_path_gives_the_fused_result(kind):
    """need_weights=True writes softmax(QKᵀ/√d_k)·V out; the default calls torch's fused
    kernel. Same equation, so the same logits up to float32 rounding."""
    model = mini(kind)
    ids = torch.randint(0, VOCAB, (2, 10))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        for m in (None, mask):
            fused = model(ids, attention_mask=m)
            explicit = model(ids, attention_mask=m, need_weights=True)
            assert (fused - explicit).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", FAMILIES)
def test_cached_decoding_equals_the_full_forward(kind):
    """A prompt at once, single tokens, then a 3-token chunk (the causal mask then has to be
    bottom-right aligned), with a capacity small enough that the cache has to grow."""
    model = mini(kind)
    ids = torch.randint(0, VOCAB, (2, 15))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(capacity=4)
        pieces = [model(ids[:, :6], cache=cache)]
        pieces += [model(ids[:, t : t + 1], cache=cache) for t in range(6, 12)]
        pieces.append(model(ids[:, 12:], cache=cache))
    assert cache.length == 15
    assert (torch.cat(pieces, 1) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", FAMILIES)
def test_left_padding_changes_nothing_for_real_tokens(kind):
    """Row 0 is 7 real tokens after 4 pads of arbitrary ids; its logits at the real positions
    equal the 7 tokens run alone (positions count from the first real token), also when the
    padded batch is decoded with a cache; row 1 has no padding and equals itself alone."""
    model = mini(kind)
    ids = torch.randint(0, VOCAB, (2, 11))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        assert torch.isfinite(batched).all()  # pad rows see no key at all: zeros, not NaN
        assert (batched[0, 4:] - model(ids[:1, 4:])[0]).abs().max() <= 1e-5
        assert (batched[1] - model(ids[1:])[0]).abs().max() <= 1e-5
        # Without the mask the pads are read as text: row 0 changes (the mask is what works).
        assert (model(ids)[0, 4:] - batched[0, 4:]).abs().max() > 1e-3

        cache = model.new_cache(capacity=4)
        pieces = [model(ids[:, :8], cache=cache, attention_mask=mask[:, :8])]
        pieces += [model(ids[:, t : t + 1], cache=cache, attention_mask=mask[:, : t + 1])
                   for t in range(8, 11)]
    assert (torch.cat(pieces, 1)[:, 4:] - batched[:, 4:]).abs().max() <= 1e-5


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_fully_masked_row_is_finite_and_leaves_the_others_alone(need_weights):
    """A row whose attention_mask is all zeros has nothing to attend to: its logits and
    gradients stay finite (no 0/0 softmax), and the other row is unchanged."""
    model = mini("rope")
    ids = torch.randint(0, VOCAB, (2, 8))
    mask = torch.ones_like(ids)
    mask[0] = 0
    logits = model(ids, attention_mask=mask, need_weights=need_weights)
    assert torch.isfinite(logits).all()
    logits.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        assert (logits[1] - model(ids[1:])[0]).abs().max() <= 1e-5


def test_relative_encodings_ignore_a_shift_of_all_positions():
    """RoPE scores depend on m − n and ALiBi's bias on |m − n|, so starting the positions at
    37 instead of 0 changes nothing; a learned absolute table does change."""
    ids = torch.randint(0, VOCAB, (2, 10))
    shifted = torch.arange(37, 47)
    with torch.no_grad():
        for kind in ("rope", "alibi"):
            model = mini(kind)
            # RoPE's cos/sin at angles 37 radians further on round differently in float32:
            # measured 4e-7 on logits of size ~2, so 1e-4 leaves a wide margin.
            assert (model(ids, positions=shifted) - model(ids)).abs().max() <= 1e-4
        model = mini("learned")
        assert (model(ids, positions=shifted) - model(ids)).abs().max() > 1e-3


def test_context_limit_is_a_clear_error_also_through_the_cache():
    """Learned and RoPE tables stop at max_len=256; ALiBi has no table and extrapolates."""
    with torch.no_grad():
        model = mini("learned")
        cache = model.new_cache()
        model(torch.zeros(1, 250, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="257 tokens exceeds the model's context max_len=256"):
            model(torch.zeros(1, 7, dtype=torch.long), cache=cache)
        long = mini("alibi")(torch.randint(0, VOCAB, (1, 300)))
    assert long.shape == (1, 300, VOCAB) and torch.isfinite(long).all()


def test_other_architectures_are_refused():
    with pytest.raises(ValueError, match="GPT needs arch='decoder', got 'encoder'"):
        GPT(ModelConfig.from_preset("bert-tiny"))
    assert isinstance(build_model(ModelConfig.from_preset("bert-tiny")), BERT)


@pytest.mark.parametrize("kind", ["learned", "alibi"])
def test_gradient_matches_finite_differences(kind):
    """In float64, along a random direction u of all parameters, the autograd directional
    derivative ∇L·u equals (L(θ + εu) − L(θ − εu)) / 2ε, with left padding in the batch.
    With ε = 1e-6 the relative error was measured at 4e-9 (learned) and 5e-8 (ALiBi): the
    O(ε²) truncation (4e-5 and 4e-4 at ε = 1e-4) plus rounding ≈ 1e-16/ε; a wrong or missing
    gradient anywhere errs by far more than the 1e-6 bound. (Not Llama: its RMSNorm computes
    in float32 by design, so float64 differences are float32 noise there.)"""
    model = mini(kind, d_model=32, n_heads=4, d_ff=64, n_decoder_layers=2).double()
    ids = torch.randint(0, VOCAB, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    targets = ids.roll(-1, 1).masked_fill(mask == 0, -100)

    def loss():
        logits = model(ids, attention_mask=mask)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    analytic, numeric = directional_derivatives(loss, list(model.parameters()))
    assert abs(analytic - numeric) <= 1e-6 * abs(analytic)


def test_training_step_reduces_loss():
    """Next-token loss on one fixed batch of random text (memorisable only through context)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig.from_preset("gpt-mini", n_decoder_layers=2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.randint(0, VOCAB, (8, 16))
    losses = []
    for _ in range(30):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # measured 0.011x (5.58 -> 0.06)
