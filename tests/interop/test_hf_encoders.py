"""RoBERTa, ALBERT, DistilBERT and ELECTRA: random-weight transformers models (each supported
head) saved locally, loaded into attnlab's one BERT model, compared on a padded batch."""

import re

import pytest
import torch
import transformers
from safetensors import safe_open

from attnlab import ModelConfig, build_model, count_parameters, from_pretrained, save_pretrained
from attnlab.errors import BadInput
from attnlab.storage import load_model_dir, save_model_dir

VOCAB = 120
SHAPE = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=100, max_position_embeddings=64, num_labels=3)
FAMILIES = {  # model_type: (config class, its fields, pad id, whether it reads token types)
    # RoBERTa as published: one token type, positions from pad_token_id + 1
    "roberta": (transformers.RobertaConfig, {**SHAPE, "type_vocab_size": 1,
                                             "max_position_embeddings": 66}, 1, False),
    # ALBERT: E = 16 < H = 48, the one layer shared by all three, GELU's tanh form
    "albert": (transformers.AlbertConfig, {**SHAPE, "embedding_size": 16}, 0, True),
    "distilbert": (transformers.DistilBertConfig,
                   dict(vocab_size=VOCAB, dim=48, n_layers=3, n_heads=4, hidden_dim=100,
                        max_position_embeddings=64, num_labels=3), 0, False),
    # ELECTRA: E = 16 projected to H = 48
    "electra": (transformers.ElectraConfig, {**SHAPE, "embedding_size": 16}, 0, True),
}
CLASSES = [
    "RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
    "RobertaForTokenClassification",
    "AlbertModel", "AlbertForMaskedLM", "AlbertForPreTraining",
    "AlbertForSequenceClassification", "AlbertForTokenClassification",
    "DistilBertModel", "DistilBertForMaskedLM", "DistilBertForTokenClassification",
    "ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM",
    "ElectraForTokenClassification",
]


def family_of(cls_name):
    return next(f for f in FAMILIES if cls_name.lower().startswith(f))


def inputs(family):
    """Three rows, two of them padded: pad ids where the mask is 0 (RoBERTa's positions are
    counted from the ids), and a second segment where the family reads token types."""
    _, _, pad, typed = FAMILIES[family]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = pad
    types = None
    if typed:
        types = torch.zeros_like(ids)
        types[:, 6:] = 1
    return ids, types, mask


def theirs_outputs(model, family):
    ids, types, mask = inputs(family)
    kwargs = {} if types is None else {"token_type_ids": types}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **kwargs)
    if hasattr(out, "last_hidden_state"):
        pooled = getattr(out, "pooler_output", None)
        return [out.last_hidden_state] + ([] if pooled is None else [pooled])
    if hasattr(out, "sop_logits"):
        return [out.prediction_logits, out.sop_logits]
    return [out.logits]


def ours_outputs(model, family):
    ids, types, mask = inputs(family)
    with torch.no_grad():
        out = model(ids, types, mask)
        if model.config.head == "none":
            return [out] + ([model.pool(out)] if model.pooler is not None else [])
    return list(out) if isinstance(out, tuple) else [out]


def make_pair(cls_name, tmp_path_factory):
    family = family_of(cls_name)
    config_class, fields, _, _ = FAMILIES[family]
    if cls_name == "AlbertForPreTraining":  # sentence order: in order or swapped
        fields = {**fields, "num_labels": 2}
    torch.manual_seed(0)
    theirs = getattr(transformers, cls_name)(config_class(**fields))
    with torch.no_grad():  # non-trivial norms, biases and heads, so copying them is tested
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05))
    theirs.eval()
    folder = tmp_path_factory.mktemp(cls_name)
    theirs.save_pretrained(folder)
    return cls_name, family, theirs, from_pretrained(folder)


@pytest.fixture(scope="module", params=CLASSES)
def pair(request, tmp_path_factory):
    return make_pair(request.param, tmp_path_factory)


def test_outputs_match_transformers_on_a_padded_batch(pair):
    cls_name, family, theirs, ours = pair
    expected, got = theirs_outputs(theirs, family), ours_outputs(ours, family)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        assert (g - e).abs().max() <= 1e-4, cls_name


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    cls_name, family, theirs, ours = pair
    save_pretrained(ours, tmp_path)
    back = getattr(transformers, cls_name).from_pretrained(tmp_path).eval()
    mine, original = back.state_dict(), theirs.state_dict()
    assert mine.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(mine[name], tensor), name
    for a, b in zip(theirs_outputs(theirs, family), theirs_outputs(back, family), strict=True):
        assert (a - b).abs().max() <= 1e-6, cls_name  # the same weights, other kernels' order


def test_each_family_is_its_configuration(tmp_path_factory):
    """The knobs each family turns, as its config.json is read."""
    configs = {f: make_pair(cls, tmp_path_factory)[3].config
               for f, cls in [("roberta", "RobertaModel"), ("albert", "AlbertModel"),
                              ("distilbert", "DistilBertModel"), ("electra", "ElectraModel")]}
    assert (configs["roberta"].position_offset, configs["roberta"].pad_id) == (2, 1)
    assert configs["albert"].share_layers and configs["albert"].embedding_size == 16
    assert configs["distilbert"].type_vocab_size == 0 and not configs["distilbert"].pooler
    assert configs["electra"].embedding_size == 16 and not configs["electra"].pooler


def test_albert_shares_one_layer_and_its_model_folder_round_trips(tmp_path, tmp_path_factory):
    _, _, _, ours = make_pair("AlbertForMaskedLM", tmp_path_factory)
    layers = ours.encoder.layers
    assert len(layers) == 3 and all(layer is layers[0] for layer in layers)
    folder = save_model_dir(tmp_path / "albert", ours, ours.config, {})
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert not any(n.startswith("encoder.layers.1.") for n in names)  # stored once
    back, config, _ = load_model_dir(folder)
    assert config == ours.config
    assert all(layer is back.encoder.layers[0] for layer in back.encoder.layers)
    for a, b in zip(ours_outputs(ours, "albert"), ours_outputs(back, "albert"), strict=True):
        assert torch.equal(a, b)


def test_roberta_positions_skip_the_padding():
    """transformers' own rule (create_position_ids_from_input_ids) on a left-padded row."""
    model = build_model(ModelConfig.from_preset("roberta-base", n_encoder_layers=1,
                                                vocab_size=50))
    ids = torch.tensor([[1, 1, 7, 8, 9], [7, 1, 8, 9, 1]])
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    expected = RobertaEmbeddings.create_position_ids_from_input_ids(ids, 1)
    assert model.positions(ids).tolist() == expected.tolist()


# the presets against transformers' class of the same shape, built on the meta device
PRESETS = [
    ("roberta-base", "none", "RobertaModel",
     dict(max_position_embeddings=514, type_vocab_size=1)),
    ("roberta-base", "mlm", "RobertaForMaskedLM",
     dict(max_position_embeddings=514, type_vocab_size=1)),
    ("albert-base", "none", "AlbertModel",
     dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    ("albert-base", "pretraining", "AlbertForPreTraining",
     dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    ("distilbert-base", "none", "DistilBertModel", {}),
    ("distilbert-base", "mlm", "DistilBertForMaskedLM", {}),
    ("electra-small", "none", "ElectraModel", {}),
    ("electra-small", "discriminator", "ElectraForPreTraining", {}),
]


@pytest.mark.parametrize("preset,head,cls_name,fields", PRESETS,
                         ids=[f"{p[0]}-{p[1]}" for p in PRESETS])
def test_preset_parameter_counts_equal_transformers(preset, head, cls_name, fields):
    with torch.device("meta"):
        ours = build_model(ModelConfig.from_preset(preset, head=head))
        config_class = FAMILIES[family_of(cls_name)][0]
        theirs = getattr(transformers, cls_name)(config_class(**fields))
    assert count_parameters(ours) == theirs.num_parameters()


@pytest.mark.parametrize("preset,head,cls_name,fields", PRESETS[::2],
                         ids=[p[0] for p in PRESETS[::2]])
def test_info_prints_the_transformers_count(capsys, preset, head, cls_name, fields):
    from tests.cli.helpers import cli

    r = cli(capsys, "info", "--preset", preset)
    assert r.code == 0 and r.err == "", r.err
    total = next(line for line in r.out.splitlines() if line.startswith("  total"))
    with torch.device("meta"):
        theirs = getattr(transformers, cls_name)(FAMILIES[family_of(cls_name)][0](**fields))
    assert int(total.split()[1].replace(",", "")) == theirs.num_parameters()


@pytest.mark.parametrize("family,field,value", [
    ("albert", "num_hidden_groups", 2), ("albert", "inner_group_num", 2),
    ("distilbert", "sinusoidal_pos_embds", True),
    ("roberta", "position_embedding_type", "relative_key"),
])
def test_unsupported_variants_are_one_line_naming_the_field(tmp_path, family, field, value):
    config_class, fields, _, _ = FAMILIES[family]
    config_class(**fields, **{field: value}).save_pretrained(tmp_path)
    with pytest.raises(BadInput, match=field) as e:
        from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need!",
             "héllo wörld, 123 tokens", "a"]


def roberta_tokenizer_json(folder):
    """A byte-level BPE of 300 tokens with RoBERTa's specials and framing, trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES * 5, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(folder / "tokenizer.json"))


def test_roberta_folder_loads_with_its_byte_level_bpe(tmp_path):
    """attnlab.load on a RoBERTa folder: its tokenizer gives transformers' ids, and the padded
    batch it makes runs to transformers' hidden states."""
    from attnlab import load
    from attnlab.tokenizers import tokenizer_from_dict

    config_class, fields, _, _ = FAMILIES["roberta"]
    theirs = transformers.RobertaModel(config_class(**{**fields, "vocab_size": 300})).eval()
    theirs.save_pretrained(tmp_path)
    roberta_tokenizer_json(tmp_path)
    loaded = load(tmp_path)
    tok, reference = loaded.tokenizer, transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.max_len == 64  # 66 position rows, the first real one is pad_id + 1 = 2
    for text in SENTENCES:
        assert tok.encode_single(text) == reference(text)["input_ids"]
    assert tok.encode_pair(*SENTENCES[:2])[0] == reference(*SENTENCES[:2])["input_ids"]
    assert tok.decode(tok.encode_single(SENTENCES[2])) == SENTENCES[2]
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id) == (1, 0, 2, 4)
    again = tokenizer_from_dict(tok.to_dict())  # as a model folder stores it
    assert again.encode_single(SENTENCES[0]) == tok.encode_single(SENTENCES[0])

    batch = tok.batch(SENTENCES)
    expected = reference(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(batch["ids"], expected["input_ids"])
    assert torch.equal(batch["attention_mask"], expected["attention_mask"])
    with torch.no_grad():
        got = loaded.model(batch["ids"], None, batch["attention_mask"])
        want = theirs(**expected).last_hidden_state
    assert (got - want).abs().max() <= 1e-4


SMALL = dict(vocab_size=100, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=2, max_len=40,
             dropout=0.0, attention_dropout=0.0)


@pytest.mark.parametrize("preset, cls", [
    ("bert-tiny", "BertModel"), ("roberta-base", "RobertaModel"), ("albert-base", "AlbertModel"),
    ("distilbert-base", "DistilBertModel"), ("electra-small", "ElectraModel")])
def test_a_model_built_from_a_preset_saves_as_its_family(preset, cls, tmp_path):
    """No hf_model_type recorded: the knob each descendant turns picks its family."""
    factorised = {"embedding_size": 16} if preset in ("albert-base", "electra-small") else {}
    torch.manual_seed(0)
    ours = build_model(ModelConfig.from_preset(preset, **SMALL, **factorised)).eval()
    save_pretrained(ours, tmp_path)
    theirs = getattr(transformers, cls).from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = ours(ids) - theirs(ids).last_hidden_state
    assert diff.abs().max() <= 1e-4


@pytest.mark.parametrize("family, change, message", [
    ("bert", {"share_layers": True}, "share_layers=True has no BertModel equivalent"),
    ("bert", {"norm_placement": "pre"}, "norm_placement='pre' has no BertModel equivalent"),
    ("roberta", {"embedding_size": 16}, "embedding_size=16 has no RobertaModel equivalent"),
    ("distilbert", {"type_vocab_size": 2}, "type_vocab_size=2 has no DistilBertModel"),
    ("electra", {"pooler": True}, "pooler=True has no ElectraModel equivalent"),
    ("roberta", {"head": "mlm", "activation": "gelu_tanh"},
     "activation='gelu_tanh' has no RobertaModel equivalent"),  # its MLM head is GELU
    ("albert", {"embedding_size": None}, "embedding_size=None has no AlbertModel equivalent"),
])
def test_saving_as_a_family_that_would_drop_a_part_is_refused(family, change, message,
                                                              tmp_path):
    preset = {"bert": "bert-tiny", "roberta": "roberta-base", "distilbert": "distilbert-base",
              "electra": "electra-small", "albert": "albert-base"}[family]
    config = ModelConfig.from_preset(preset, **SMALL, **change,
                                     extra={"hf_model_type": family})
    with pytest.raises(ValueError, match=re.escape(message)):
        save_pretrained(build_model(config), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_pooler_that_no_head_reads_does_not_pick_the_family(tmp_path):
    """BERT's discriminator head with the config's default pooler=True: nothing is dropped, so
    it saves as an ElectraForPreTraining and transformers gives the same logits."""
    torch.manual_seed(0)
    ours = build_model(ModelConfig.from_preset("bert-tiny", **SMALL, head="discriminator"))
    save_pretrained(ours.eval(), tmp_path)
    theirs = transformers.ElectraForPreTraining.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max() <= 1e-4
