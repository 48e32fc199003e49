"""attnlab.cpu.encoder: linears packed for oneDNN, against float64 products and transformers'
BERT with the same weights."""

import pytest
import torch
import transformers
from torch import nn

from attnlab import from_pretrained
from attnlab.cpu.encoder import PackedFeedForward, PackedLinear, for_encoding, packed_products
from attnlab.errors import BadInput

pytestmark = pytest.mark.skipif(not packed_products(), reason="oneDNN's packed product is "
                                "not available in this PyTorch")
needs_bf16 = pytest.mark.skipif(not packed_products(torch.bfloat16), reason="oneDNN's packed "
                                "bf16 product needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT")

BERT = dict(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=100, max_position_embeddings=64)


def _packed(dtype: torch.dtype, bias: bool = True) -> tuple[nn.Linear, PackedLinear]:
    torch.manual_seed(0)
    plain = nn.Linear(83, 45, bias=bias)
    layer = nn.Linear(83, 45, bias=bias)
    layer.load_state_dict(plain.state_dict())
    layer.__class__ = PackedLinear
    return plain, layer.pack(dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_fp32_products_equal_the_float64_product(bias):
    """Any leading shape and row count (the layout is packed for 128 rows), within 1e-5."""
    plain, layer = _packed(torch.float32, bias)
    exact = nn.Linear(83, 45, bias=bias).double()
    exact.load_state_dict(plain.state_dict())
    for x in (torch.randn(1, 83), torch.randn(2, 70, 83), torch.randn(300, 83)):
        with torch.no_grad():
            assert layer._packed_applies(x)  # oneDNN's product, not nn.Linear's
            got = layer(x)
            want = exact(x.double())
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)


@needs_bf16
def test_bf16_products_round_the_input_and_weight_and_sum_in_float32():
    """bf16: y = bf16(bf16(x) · bf16(W)ᵀ + bf16(b)), each product exact, the sums float32 and
    the result rounded once to bf16 (as autocast's linear), returned float32: within half a
    bf16 step of that float64 product."""
    plain, layer = _packed(torch.bfloat16)
    x = torch.randn(2, 70, 83)
    with torch.no_grad():
        got = layer(x)
        x2, w2, b2 = (t.bfloat16().double() for t in (x, plain.weight, plain.bias))
        want = x2 @ w2.t() + b2
    assert got.dtype == torch.float32
    assert ((got.double() - want).abs() <= want.abs() * 2**-8 + 1e-6).all()
    assert not torch.allclose(got, plain(x), atol=1e-4)  # it did round (not fp32's product)


def test_training_autocast_and_a_changed_weight_take_the_right_product():
    """A gradient to pass and CPU autocast run nn.Linear's own product; a weight changed in
    place (an optimizer's step) is packed again before the next product."""
    plain, layer = _packed(torch.float32)
    x = torch.randn(5, 83, requires_grad=True)
    layer(x).sum().backward()
    assert torch.allclose(x.grad, plain.weight.sum(0).expand(5, -1), atol=1e-6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    with torch.no_grad():
        layer.weight.mul_(2)
        assert torch.allclose(layer(x), x @ layer.weight.t() + layer.bias, atol=1e-5)


@needs_bf16
def test_whatever_changes_the_parameters_is_packed_again():
    """A bias changed in place, a weight replaced through ``.data``, a cast there and back: the
    next product reads the new values, not the packed copy of the old ones."""
    plain, layer = _packed(torch.bfloat16)
    x = torch.randn(4, 83)

    def matches():
        with torch.no_grad():
            w, b = layer.weight.bfloat16().double(), layer.bias.bfloat16().double()
            want = x.bfloat16().double() @ w.t() + b
            return ((layer(x).double() - want).abs() <= want.abs() * 2**-8 + 1e-6).all()

    assert matches()
    with torch.no_grad():
        layer.bias.add_(3.0)
    assert matches()
    layer.weight.data = torch.ones_like(layer.weight)
    assert matches()
    layer.double().float()
    assert matches()


def test_copies_and_pickles_pack_their_own():
    """oneDNN's packed matrix has no storage to copy: deepcopy and torch.save leave it out and
    the copy packs again, giving the same numbers."""
    import copy
    import io

    _, layer = _packed(torch.float32)
    model = nn.Sequential(layer)
    x = torch.randn(3, 83)
    with torch.no_grad():
        want = model(x)
        twin = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert torch.equal(twin(x), want) and torch.equal(loaded(x), want)
    assert isinstance(twin[0], PackedLinear) and twin[0].packed is not None


def test_the_fused_feed_forward_trains_as_the_plain_one():
    """Training mode, or a trainable W₂ behind a frozen W₁: FeedForward's own forward, so W₂
    gets its gradient and dropout applies."""
    from attnlab.nn.feedforward import FeedForward

    torch.manual_seed(0)
    block = FeedForward(16, 40, activation="gelu").eval()
    reference = FeedForward(16, 40, activation="gelu").eval()
    reference.load_state_dict(block.state_dict())
    assert for_encoding(block, "fp32") and isinstance(block, PackedFeedForward)
    block.w1.weight.requires_grad_(False)
    block.w1.bias.requires_grad_(False)
    x = torch.randn(5, 16)
    block(x).sum().backward()
    reference(x).sum().backward()
    assert block.w2.weight.grad is not None
    assert torch.allclose(block.w2.weight.grad, reference.w2.weight.grad, atol=1e-5)
    with torch.no_grad():
        calls = []
        original = PackedLinear.product
        def spy(self, x, then="none", *rest, **kw):
            calls.append(then)
            return original(self, x, then, *rest, **kw)

        PackedLinear.product = spy
        try:
            block.train()
            block(x)
            assert calls == ["none", "none"]  # training: FeedForward's forward, GELU apart
            calls.clear()
            block.eval()
            assert torch.allclose(block(x), reference(x), atol=1e-5)
            assert calls == ["gelu", "none"]  # the GELU inside W₁'s product
        finally:
            PackedLinear.product = original


def test_a_quantised_model_keeps_its_own_kernels():
    from attnlab.nn.quantized import Int8Linear

    model = nn.Sequential(Int8Linear.from_linear(nn.Linear(64, 64)), nn.Linear(64, 2))
    assert not for_encoding(model, "fp32")
    assert type(model[1]) is nn.Linear


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16)])
def test_a_packed_bert_gives_transformers_hidden_states(precision, tmp_path):
    """transformers' BertModel, saved and loaded: after :func:`for_encoding` the hidden states
    at real tokens are within 1e-5 of transformers' in fp32, and the
    mean-pooled sentence vectors within cosine 0.9999 in bf16; the state dict is untouched."""
    torch.manual_seed(0)
    theirs = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
    theirs.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path).eval()
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    assert for_encoding(ours, precision)
    assert sum(isinstance(m, PackedLinear) for m in ours.modules()) == 2 * 6 + 1  # pooler
    assert sum(isinstance(m, PackedFeedForward) for m in ours.modules()) == 2  # GELU fused
    ids = torch.randint(5, 120, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    calls = []
    original = PackedLinear.product
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        PackedLinear.product = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
        try:
            got = ours.encode(ids, None, mask)
        finally:
            PackedLinear.product = original
    assert len(calls) == 2 * 6  # every product of both layers was oneDNN's
    real = mask.bool()
    if precision == "fp32":
        assert (got - want)[real].abs().max() < 1e-5
    else:
        m = mask[..., None]
        cos = torch.nn.functional.cosine_similarity((got * m).sum(1), (want * m).sum(1))
        assert cos.min() > 0.9999  # mean-pooled sentence vectors (the count cancels)
        assert (got - want)[real].abs().max() > 1e-5  # bf16 products did run
    after = ours.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_where_bf16_cannot_be_packed_nothing_changes(monkeypatch):
    """A CPU without oneDNN's bf16 path (an AVX2 one): for_encoding in bf16 leaves the model
    as it was and says so, so the caller keeps autocast."""
    from attnlab.cpu import encoder

    monkeypatch.setitem(encoder._WORKS, torch.bfloat16, False)
    model = nn.Sequential(nn.Linear(4, 4))
    assert not for_encoding(model, "bf16")
    assert type(model[0]) is nn.Linear


def test_other_precisions_are_refused():
    with pytest.raises(BadInput, match="fp32 or bf16"):
        for_encoding(nn.Sequential(nn.Linear(2, 2)), "fp16")
