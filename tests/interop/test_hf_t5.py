"""T5ForConditionalGeneration (v1.0 and v1.1 / Flan-T5): random-weight transformers models saved
locally, loaded into attnlab's Transformer, compared on logits, greedy and beam search; attnlab's
folders loaded back by transformers; the t5-small preset's size."""

import copy
import json
import re

import pytest
import torch
import transformers
from transformers.generation import LogitsProcessor, LogitsProcessorList

from attnlab import from_pretrained, save_pretrained
from attnlab.build import build_model, count_parameters
from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.generation import beam_search, greedy_decode
from tests.cli.helpers import cli

PAD, EOS, VOCAB = 0, 1, 64
COMMON = dict(vocab_size=VOCAB, d_model=32, relative_attention_num_buckets=8,
              relative_attention_max_distance=12,  # short, so that test sentences reach it
              dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
CONFIGS = {
    # v1.0: ReLU, the head tied to the embeddings and fed hidden · d^-½; 2 + 3 layers
    "v1.0": dict(COMMON, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
                 feed_forward_proj="relu"),
    # v1.1 / Flan-T5: gated GELU, its own lm_head, heads · d_kv = 36 ≠ d_model; 3 + 2 layers
    "v1.1": dict(COMMON, d_kv=12, d_ff=40, num_layers=3, num_decoder_layers=2, num_heads=3,
                 feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def hf_folder(kind: str, folder):
    """A transformers T5 with non-trivial norms (so copying them is tested), saved to
    ``folder``; v1.1 with its own lm_head and the config.json of a published Flan-T5
    (``tie_word_embeddings: false``, as transformers 4 wrote it)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**CONFIGS[kind]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif "shared" not in name and "relative" not in name:
                # T5's initialisation ×3: layers that change the residual stream enough for
                # the generated tokens to depend on the source (at ×1 they repeat one token)
                p.mul_(3.0)
        if kind == "v1.1":  # transformers 5 builds even this one tied: untie it by hand
            model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32) * 0.5)
    model.save_pretrained(folder)
    if kind == "v1.1":
        path = folder / "config.json"
        hf = json.loads(path.read_text())
        hf["tie_word_embeddings"] = False
        hf.pop("scale_decoder_outputs", None)
        path.write_text(json.dumps(hf))


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"t5-{request.param}")
    hf_folder(request.param, folder)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    return request.param, theirs, from_pretrained(folder)


def batch(n=3, src_len=16, tgt_len=14, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, VOCAB, (n, src_len), generator=g)
    src[1, 11:] = PAD  # padded sources
    src[2, 4:] = PAD
    tgt = torch.randint(2, VOCAB, (n, tgt_len), generator=g)
    tgt[:, 0] = PAD  # the decoder start token
    return src, tgt


def hf_logits(theirs, src, tgt):
    with torch.no_grad():
        return theirs(input_ids=src, attention_mask=(src != PAD).long(),
                      decoder_input_ids=tgt).logits


def test_config_is_read_as_the_family_it_is(pair):
    kind, theirs, ours = pair
    c = ours.config
    assert (c.positional, c.norm, c.norm_placement, c.bias) == ("relative", "rmsnorm", "pre", False)
    assert not c.scale_attention and not c.scale_embeddings
    assert c.d_k == theirs.config.d_kv and c.n_decoder_layers == theirs.config.num_decoder_layers
    assert c.scale_tied_logits == theirs.config.scale_decoder_outputs
    assert c.activation == {"v1.0": "relu", "v1.1": "geglu"}[kind]
    assert c.tie_embeddings == (kind == "v1.0")
    assert (c.pad_id, c.bos_id, c.eos_id) == (PAD, PAD, EOS)


def test_logits_match_transformers_with_padding(pair):
    _, theirs, ours = pair
    src, tgt = batch()
    expected = hf_logits(theirs, src, tgt)
    with torch.no_grad():
        got = ours(src, tgt)
    assert (got - expected).abs().max() <= 1e-4


def test_relative_bias_tables_are_copied(pair):
    _, theirs, ours = pair
    enc = theirs.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    dec = theirs.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    assert torch.equal(ours.positional.embedding.weight, enc)
    assert torch.equal(ours.tgt_positional.embedding.weight, dec)
    assert not ours.tgt_positional.bidirectional and ours.positional.bidirectional


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    kind, _, ours = pair
    ours = copy.deepcopy(ours)  # the fixture's stays as loaded
    if kind == "v1.1":  # untied: a head trained apart from the embedding must survive the trip
        assert ours.tgt_embed is ours.src_embed and ours.lm_head.weight is not ours.src_embed.weight
        with torch.no_grad():
            ours.lm_head.weight.add_(torch.randn_like(ours.lm_head.weight) * 0.1)
    save_pretrained(ours, tmp_path / "ours")
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ours").eval()
    src, tgt = batch(seed=2)
    with torch.no_grad():
        expected = ours(src, tgt)
    assert (hf_logits(theirs, src, tgt) - expected).abs().max() <= 1e-4
    back = from_pretrained(tmp_path / "ours")
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                 ours.state_dict().values(), strict=True))


class NeverPad(LogitsProcessor):
    """attnlab's rule in greedy and beam search: pad is never a word of the output, and the
    log-probabilities are those of the other tokens (normalised without pad). The comparisons
    below give transformers' generate this rule, so they test equal decoding under it, not
    transformers' defaults (which may emit pad, and score beams before banning it)."""

    def __call__(self, input_ids, scores):
        return scores.index_fill(-1, torch.tensor([PAD]), float("-inf")).log_softmax(-1)


def hf_generate(theirs, src, **kwargs):
    # use_cache=False: transformers sizes T5's decoder cache by num_layers (the encoder's),
    # which fails when the decoder has more layers; attnlab's side decodes with its cache
    return theirs.generate(src, attention_mask=(src != PAD).long(), do_sample=False,
                           use_cache=False, logits_processor=LogitsProcessorList([NeverPad()]),
                           **kwargs)


def until_eos(row):
    """A hypothesis up to and including eos (what follows is filler: pad)."""
    return row[: row.index(EOS) + 1] if EOS in row else row


def test_greedy_equals_transformers_generate(pair):
    _, theirs, ours = pair
    src, _ = batch(n=6, seed=3)
    expected = hf_generate(theirs, src, num_beams=1, max_length=24)
    got = greedy_decode(ours, src, max_len=24)
    assert got.tolist() == expected.tolist()
    assert got.shape[1] > 16  # decoding went past the relative bias's max_distance


def test_beam_four_equals_transformers(pair):
    _, theirs, ours = pair
    src, _ = batch(n=6, seed=4)
    expected = hf_generate(theirs, src, num_beams=4, max_length=16, early_stopping=True,
                           length_penalty=1.0)
    got = beam_search(ours, src, beam_size=4, alpha=1.0, max_len=16, penalty="average")
    assert [until_eos(r) for r in got.tolist()] == [until_eos(r) for r in expected.tolist()]


def test_both_styles_count_as_transformers(pair):
    """One embedding matrix for both stacks, an untied head only where the folder has one."""
    _, theirs, ours = pair
    assert count_parameters(ours) == theirs.num_parameters()


def test_t5_small_preset_has_t5_smalls_parameters(capsys):
    with torch.device("meta"):
        expected = transformers.T5ForConditionalGeneration(transformers.T5Config()).num_parameters()
        ours = count_parameters(build_model(ModelConfig.from_preset("t5-small")))
    assert ours == expected
    r = cli(capsys, "info", "--preset", "t5-small")
    assert r.code == 0, r.err
    total = re.search(r"total\s+([\d,]+)", r.out)
    assert total and int(total.group(1).replace(",", "")) == expected


def test_unsupported_feed_forward_is_named(tmp_path):
    cfg = dict(CONFIGS["v1.0"], feed_forward_proj="gated-relu")  # valid in transformers
    transformers.T5ForConditionalGeneration(transformers.T5Config(**cfg)).save_pretrained(tmp_path)
    with pytest.raises(BadInput, match="feed_forward_proj='gated-relu' is not supported"):
        from_pretrained(tmp_path)


def test_a_config_t5_cannot_express_is_refused(tmp_path):
    model = build_model(ModelConfig.from_preset("tiny"))  # the paper's: post-LN, sinusoidal
    cfg = model.config
    model.config = ModelConfig.from_dict({**cfg.to_dict(), "extra": {"hf_model_type": "t5"}})
    with pytest.raises(BadInput, match="no T5ForConditionalGeneration equivalent"):
        save_pretrained(model, tmp_path)


def _word_tokenizer(path) -> None:
    """A tokenizer.json of T5's special ids (pad 0, eos 1, unk 2) and 61 words: w3 … w63."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok.save(str(path))


def test_a_folder_with_a_tokenizer_json_translates_and_is_explained(pair, tmp_path, capsys):
    """An encoder–decoder folder with one tokenizer.json (T5's way) reads its source and writes
    its target with it: `translate` gives transformers' greedy answer, and `explain` follows
    the sentence through the encoder, the decoder and every step to the same answer."""
    from tokenizers import Tokenizer

    kind, theirs, _ = pair
    folder = tmp_path / "t5"
    hf_folder(kind, folder)
    _word_tokenizer(folder / "tokenizer.json")
    sentence = "w5 w17 w42 w9 w33"
    hf_tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    src = torch.tensor([hf_tok.encode(sentence).ids + [EOS]])
    limit = src.shape[1] + 50  # translate's: 50 tokens past the source
    ids = hf_generate(theirs, src, num_beams=1, max_length=limit)[0]
    expected = hf_tok.decode(ids.tolist(), skip_special_tokens=True)
    assert expected  # some words, not only specials

    r = cli(capsys, "translate", "--model", folder, sentence, "--precision", "fp32")
    assert r.code == 0 and r.out.strip() == expected, r.err
    r = cli(capsys, "explain", "--model", folder, sentence)
    assert r.code == 0, r.err
    assert "checks passed" in r.out and "FAILED" not in r.out
    built = re.search(r"translation, built token by token: '([^']*)'", r.out).group(1)
    assert built == expected
