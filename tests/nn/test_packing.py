"""Packing (nn/packing.py): a training step of BERT on the real tokens alone gives the
padded computation's outputs at real positions, and the same gradients."""

import torch

from attnlab import BERT, ModelConfig
from attnlab.nn.packing import Packing


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, 4:], mask[2, 7:] = 0, 0
    return ids, torch.zeros_like(ids), mask


def test_pack_and_unpack_round_trip():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()
    x = torch.arange(18.0).view(2, 3, 3)
    p = Packing.of(mask)
    assert p.pack(x).tolist() == [x[0, 0].tolist(), x[0, 1].tolist(), x[1, 0].tolist()]
    assert torch.equal(p.unpack(p.pack(x)), x * mask[..., None])
    assert Packing.of(torch.ones(2, 3, dtype=torch.bool)) is None  # nothing to skip


def test_a_packed_training_pass_equals_the_padded_one_at_real_tokens():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("bert-tiny", vocab_size=100, dropout=0.0,
                                     attention_dropout=0.0, head="tokens", num_labels=4)
    model = BERT(config)
    ids, types, mask = _batch()
    real = mask.bool()
    results = {}
    for name, training in (("packed", True), ("padded", False)):
        model.train(training)  # training packs (dropout is 0: the same function otherwise)
        model.zero_grad()
        out = model(ids, types, mask)
        out[real].square().sum().backward()
        results[name] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                        if p.grad is not None})
    (packed, g_packed), (padded, g_padded) = results["packed"], results["padded"]
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert g_packed.keys() == g_padded.keys() and g_packed
    for name in g_packed:
        torch.testing.assert_close(g_packed[name], g_padded[name], atol=1e-5, rtol=1e-4)
    hidden = model.train().encode(ids, types, mask)
    assert hidden[~real].abs().max() == 0  # nothing was computed for padding
