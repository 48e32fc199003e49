import torch

from attnlab.nn import causal_mask, combine_masks, lengths_mask, padding_mask


def test_padding_and_lengths_masks_agree():
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    m = padding_mask(ids, pad_id=0)
    assert m.shape == (2, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert torch.equal(m, lengths_mask(torch.tensor([3, 1]), 4))


def test_causal_mask_square_and_offset():
    assert causal_mask(3)[0, 0].tolist() == [
        [True, False, False], [True, True, False], [True, True, True]]
    # two new queries after three cached positions
    assert causal_mask(2, 5)[0, 0].tolist() == [
        [True, True, True, True, False], [True, True, True, True, True]]


def test_combine_masks_is_logical_and_with_broadcast():
    pad = lengths_mask(torch.tensor([2, 3]), 3)
    both = combine_masks(pad, None, causal_mask(3))
    assert both.shape == (2, 1, 3, 3)
    assert both[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert combine_masks(None, None) is None
