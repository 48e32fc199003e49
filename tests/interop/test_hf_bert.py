"""BERT: random-weight transformers models (every head) saved locally, loaded into attnlab."""

import pytest
import torch
import transformers

from attnlab import ModelConfig, build_model, count_parameters, from_pretrained, save_pretrained

BERT = dict(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=100, max_position_embeddings=64, num_labels=3)
CLASSES = ["BertModel", "BertForMaskedLM", "BertForPreTraining",
           "BertForSequenceClassification", "BertForTokenClassification"]


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # padding in two rows
    mask[2, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1  # sentence B
    return ids, types, mask


def outputs(cls_name, theirs_out):
    if cls_name == "BertModel":
        return [theirs_out.last_hidden_state, theirs_out.pooler_output]
    if cls_name == "BertForPreTraining":
        return [theirs_out.prediction_logits, theirs_out.seq_relationship_logits]
    return [theirs_out.logits]


def make_pair(cls_name, tmp_path_factory):
    torch.manual_seed(0)
    theirs = getattr(transformers, cls_name)(transformers.BertConfig(**BERT))
    with torch.no_grad():  # non-trivial norms, biases and heads, so copying them is tested
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    theirs.eval()
    folder = tmp_path_factory.mktemp(cls_name)
    theirs.save_pretrained(folder)
    return cls_name, theirs, from_pretrained(folder)


@pytest.fixture(scope="module", params=CLASSES)
def pair(request, tmp_path_factory):
    return make_pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    return make_pair("BertModel", tmp_path_factory)


def ours_outputs(cls_name, model, ids, types, mask):
    out = model(ids, types, mask)
    if cls_name == "BertModel":
        return [out, model.pool(out)]
    return list(out) if isinstance(out, tuple) else [out]


def test_outputs_match_transformers_with_padding_and_token_types(pair):
    cls_name, theirs, ours = pair
    ids, types, mask = inputs()
    with torch.no_grad():
        expected = outputs(cls_name, theirs(input_ids=ids, token_type_ids=types,
                                            attention_mask=mask))
        got = ours_outputs(cls_name, ours, ids, types, mask)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        assert (g - e).abs().max() <= 1e-4


def test_hidden_states_of_every_layer_match(bare):
    _, theirs, ours = bare
    ids, types, mask = inputs()
    captured = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append(o))
             for layer in ours.encoder.layers]
    with torch.no_grad():
        ours.encode(ids, types, mask)
        expected = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask,
                          output_hidden_states=True).hidden_states[1:]
    for h in hooks:
        h.remove()
    real = mask.bool()[..., None]
    for g, e in zip(captured, expected, strict=True):
        assert ((g - e) * real).abs().max() <= 1e-4


def test_save_pretrained_round_trips_through_transformers(pair, tmp_path):
    cls_name, theirs, ours = pair
    save_pretrained(ours, tmp_path)
    back = getattr(transformers, cls_name).from_pretrained(tmp_path).eval()
    ids, types, mask = inputs()
    with torch.no_grad():
        a = outputs(cls_name, theirs(input_ids=ids, token_type_ids=types, attention_mask=mask))
        b = outputs(cls_name, back(input_ids=ids, token_type_ids=types, attention_mask=mask))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_mlm_decoder_is_tied_to_the_input_embedding():
    model = build_model(ModelConfig.from_preset("bert-tiny", head="mlm"))
    assert model.mlm.weight is model.embed.weight


@pytest.mark.parametrize("preset,cls_name", [("bert-base", "BertModel"),
                                             ("bert-base", "BertForMaskedLM")])
def test_parameter_count_equals_transformers(preset, cls_name):
    head = "none" if cls_name == "BertModel" else "mlm"
    ours = count_parameters(build_model(ModelConfig.from_preset(preset, head=head)))
    with torch.device("meta"):
        theirs = getattr(transformers, cls_name)(transformers.BertConfig())
    assert ours == sum(p.numel() for p in theirs.parameters())
    if head == "none":
        assert ours == 109_482_240  # "110M"


def test_bert_large_is_340m():
    with torch.device("meta"):
        model = build_model(ModelConfig.from_preset("bert-large"))
    assert round(count_parameters(model) / 1e6) == 335  # BertModel-large; "340M" in the paper


def test_unknown_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "bert", "architectures": ["BertForNextSentencePrediction"], '
        '"vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2, '
        '"intermediate_size": 16, "num_hidden_layers": 1}')
    with pytest.raises(ValueError, match="architectures='BertForNextSentencePrediction'"):
        from_pretrained(tmp_path)


def test_old_gamma_beta_layer_norm_names_load(tmp_path, bare):
    """Older BERT checkpoints name LayerNorm parameters gamma/beta (and carry a bert. prefix
    on a bare encoder); both spellings load to the same model."""
    from safetensors.torch import load_file, save_file

    _, theirs, ours = bare
    theirs.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    renamed = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma")
               .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in weights.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    old = from_pretrained(tmp_path)
    for (name, a), b in zip(ours.state_dict().items(), old.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
