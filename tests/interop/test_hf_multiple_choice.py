"""The multiple-choice head (``head="choice"``) against transformers' ``BertForMultipleChoice``,
``RobertaForMultipleChoice`` and ``AlbertForMultipleChoice``: random weights saved by
transformers load with ``attnlab.load`` into the one BERT model and give the same logits, and
``save_pretrained`` writes a folder transformers reads back to the same logits."""

import pytest
import torch
import transformers

import attnlab
from attnlab import BERT

SHAPE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=37, max_position_embeddings=40)
FAMILIES = {
    "bert": (transformers.BertConfig, transformers.BertForMultipleChoice, 0),
    "roberta": (transformers.RobertaConfig, transformers.RobertaForMultipleChoice, 1),
    "albert": (lambda **kw: transformers.AlbertConfig(embedding_size=16, **kw),
               transformers.AlbertForMultipleChoice, 0),
}


def inputs(pad: int, segments: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(2 questions, 3 choices, 12 tokens): some choices padded, token types 0 then 1."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (2, 3, 12), generator=g)
    mask = torch.ones_like(ids)
    for q, c, n in ((0, 1, 7), (1, 2, 4), (1, 0, 10)):
        ids[q, c, n:], mask[q, c, n:] = pad, 0
    types = torch.zeros_like(ids)
    if segments:
        types[..., 5:] = 1
    return ids, types * mask, mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_multiple_choice_logits_equal_transformers(tmp_path, family):
    make_config, make_model, pad = FAMILIES[family]
    torch.manual_seed(0)
    theirs = make_model(make_config(**SHAPE)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ids, types, mask = inputs(pad, segments=family != "roberta")
    with torch.no_grad():
        expected = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).logits

    ours = attnlab.load(tmp_path / "hf").model
    assert type(ours) is BERT and ours.config.head == "choice"  # the one model, by config
    with torch.no_grad():
        got = ours(ids, types, mask)
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)

    attnlab.save_pretrained(ours, tmp_path / "back")
    again = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "back").eval()
    assert type(again) is make_model
    with torch.no_grad():
        round_trip = again(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(round_trip, expected, atol=1e-4, rtol=0)


def test_each_choice_is_its_own_sequence():
    """A question's logits do not depend on the other choices it is batched with: each row of
    ``(batch, choices, seq)`` is read alone (as ``(1, 1, seq)``)."""
    config = attnlab.ModelConfig.from_preset("bert-tiny", vocab_size=50, max_len=16,
                                             head="choice")
    torch.manual_seed(0)
    model = BERT(config).eval()
    ids, types, mask = inputs(0, segments=True)
    ids = ids % 50
    with torch.no_grad():
        together = model(ids, types, mask)
        alone = torch.tensor([[float(model(ids[q, c][None, None], types[q, c][None, None],
                                           mask[q, c][None, None]))
                               for c in range(3)] for q in range(2)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
