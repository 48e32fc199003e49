"""MarianMTModel: random-weight transformers models saved locally, loaded into attnlab."""

import pytest
import torch
import transformers

from attnlab import from_pretrained
from attnlab.generation import greedy_decode
from attnlab.nn import sinusoidal_table

PAD = 59
MARIAN = dict(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=3,
              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
              decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=PAD,
              decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=None,
              activation_function="swish", scale_embedding=True,
              bad_words_ids=[[PAD]])  # as in published Marian configs: never emit pad


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    theirs = transformers.MarianMTModel(transformers.MarianConfig(**MARIAN)).eval()
    with torch.no_grad():  # non-trivial weights, norms, biases and output bias
        for name, p in theirs.named_parameters():
            if "embed_positions" not in name:  # a fixed table, not stored in the file
                p.add_(torch.randn_like(p) * 0.3)
        theirs.final_logits_bias.normal_()
    folder = tmp_path_factory.mktemp("marian")
    theirs.save_pretrained(folder)
    return theirs, from_pretrained(folder)


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, PAD, (3, 10), generator=g)
    src[1, 7:] = PAD  # padded sources
    src[2, 4:] = PAD
    tgt = torch.randint(1, PAD, (3, 8), generator=g)
    tgt[:, 0] = PAD  # the decoder start token
    return src, tgt


def test_logits_match_transformers_with_padding(pair):
    theirs, ours = pair
    src, tgt = batch()
    with torch.no_grad():
        expected = theirs(input_ids=src, attention_mask=(src != PAD).long(),
                          decoder_input_ids=tgt).logits
        got = ours(src, tgt)
    assert (got - expected).abs().max() <= 1e-4


def test_positions_are_marians_split_sinusoids(pair):
    theirs, ours = pair
    table = theirs.model.encoder.embed_positions.weight[:20]
    assert (sinusoidal_table(20, 32, split=True) - table).abs().max() <= 1e-6
    assert (ours.positional.pe[:20] - table).abs().max() <= 1e-6


def test_greedy_equals_transformers_generate(pair):
    theirs, ours = pair
    src, _ = batch()
    expected = theirs.generate(src, attention_mask=(src != PAD).long(), num_beams=1,
                               do_sample=False, max_length=20)
    got = greedy_decode(ours, src, max_len=20)
    assert got.tolist() == expected.tolist()


def test_save_pretrained_round_trips_through_transformers(trained_marian):
    model, folder = trained_marian  # written by attnlab's save_pretrained
    theirs = transformers.MarianMTModel.from_pretrained(folder).eval()
    src = torch.tensor([[5, 9, 14, 1, 0], [7, 3, 22, 30, 1]])
    tgt = torch.tensor([[0, 14, 9, 5, 1], [0, 30, 22, 3, 7]])
    with torch.no_grad():
        expected = model(src, tgt)
        got = theirs(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt)
    assert (got.logits - expected).abs().max() <= 1e-5
    back = from_pretrained(folder)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_unsupported_marian_config_is_named(tmp_path):
    cfg = dict(MARIAN, decoder_ffn_dim=64)
    transformers.MarianMTModel(transformers.MarianConfig(**cfg)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="encoder_ffn_dim=48 and decoder_ffn_dim=64 differ"):
        from_pretrained(tmp_path)
