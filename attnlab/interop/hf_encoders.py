"""BERT's descendants as Hugging Face stores them, mapped onto attnlab's one BERT model.

Each family is BERT with a few knobs turned (:mod:`attnlab.models.bert`):

* ``roberta``: positions counted from ``pad_token_id + 1`` over the non-pad tokens, a
  one-row token-type table, ``<s>``/``</s>`` ids; its sequence classifier
  (``classifier.dense`` + tanh + ``classifier.out_proj`` on ``<s>``) is BERT's pooler and
  classifier under other names.
* ``albert``: embeddings ``embedding_size`` wide lifted by ``embedding_hidden_mapping_in``, one
  layer shared by all ``num_hidden_layers``, an MLM head predicting in E dimensions, the
  sentence-order head in place of next-sentence prediction.
* ``distilbert``: BERT's layer under other names, no token types, no pooler.
* ``electra``: embeddings projected by ``embeddings_project`` when E ≠ hidden size, no pooler,
  the discriminator's replaced-token head (``ElectraForPreTraining``); the generator is
  ``ElectraForMaskedLM``.

As for BERT, a headed class stores the encoder under a prefix (``roberta.``, ``albert.``, ...)
and a bare one without; either spelling loads.
"""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.hf_bert import (
    BERT_LAYER,
    bert_fields,
    bert_hf_fields,
    check_absolute_positions,
    embedding_rows,
    has_its_pooler,
    head_of,
    labels_from_hf,
    labels_to_hf,
    linear_rows,
    no_pooler,
    prefix_alternatives,
    require_bert_shape,
)
from attnlab.interop.huggingface import (
    Family,
    activation_from_hf,
    activation_to_hf,
    register,
    require,
)

# transformers' config defaults (the published base shapes), for fields a config.json omits
ROBERTA_DEFAULTS = dict(vocab_size=50265, hidden_size=768, num_attention_heads=12,
                        intermediate_size=3072, num_hidden_layers=12, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2)
_ALBERT_DEFAULTS = dict(vocab_size=30000, embedding_size=128, hidden_size=4096,
                        num_attention_heads=64, intermediate_size=16384, num_hidden_layers=12,
                        hidden_act="gelu_new", hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=0, bos_token_id=2,
                        eos_token_id=3)
_DISTILBERT_DEFAULTS = dict(vocab_size=30522, dim=768, n_heads=12, hidden_dim=3072, n_layers=6,
                            max_position_embeddings=512, dropout=0.1, attention_dropout=0.1,
                            pad_token_id=0)
_ELECTRA_DEFAULTS = dict(vocab_size=30522, embedding_size=128, hidden_size=256,
                         num_attention_heads=4, intermediate_size=1024, num_hidden_layers=12,
                         pad_token_id=0)

# the transformers class -> attnlab's head (the first: a bare encoder)
_CLASSES = {
    "roberta": {"RobertaModel": "none", "RobertaForMaskedLM": "mlm",
                "RobertaForSequenceClassification": "classify",
                "RobertaForTokenClassification": "tokens", "RobertaForMultipleChoice": "choice"},
    "albert": {"AlbertModel": "none", "AlbertForMaskedLM": "mlm",
               "AlbertForPreTraining": "pretraining",
               "AlbertForSequenceClassification": "classify",
               "AlbertForTokenClassification": "tokens", "AlbertForMultipleChoice": "choice"},
    "distilbert": {"DistilBertModel": "none", "DistilBertForMaskedLM": "mlm",
                   "DistilBertForTokenClassification": "tokens"},
    "electra": {"ElectraModel": "none", "ElectraForPreTraining": "discriminator",
                "ElectraForMaskedLM": "mlm", "ElectraForTokenClassification": "tokens"},
}


def _class_of(family: str):
    heads = {head: cls for cls, head in _CLASSES[family].items()}

    def class_name(c: ModelConfig) -> str:
        if c.head not in heads:
            raise BadInput(f"head={c.head!r} has no {family} class (heads: {sorted(heads)})")
        return heads[c.head]

    return class_name


def _layer(*theirs: str) -> list[tuple[str, str]]:
    """A layer table: transformers' names for the modules of :data:`BERT_LAYER`, in its order
    (W_Q, W_K, W_V, W_O, attention norm, W_1, W_2, feed-forward norm)."""
    return list(zip([ours for ours, _ in BERT_LAYER], theirs, strict=True))


def _config(family: str, hf: dict, fields: dict, **knobs) -> ModelConfig:
    """A ModelConfig from the BERT fields, the head config.json's class names and the family's
    own knobs."""
    extra = {"hf_model_type": family}
    head = head_of(hf, _CLASSES[family], family)
    return ModelConfig(**{**fields, **knobs}, head=head, num_labels=labels_from_hf(hf, extra),
                       extra=extra)


def _gelu_head(family: str, hf: dict, cls: str) -> None:
    """RoBERTa's and ELECTRA's generator MLM heads apply GELU whatever ``hidden_act`` says;
    attnlab's head uses the model's one activation, so the two must agree."""
    act = hf.get("hidden_act", "gelu")
    if (hf.get("architectures") or [""])[0] == cls and act != "gelu":
        raise BadInput(f"hidden_act={act!r} is not supported for {family} {cls} (its MLM head "
                       "is always 'gelu')")


def _mlm_gelu(c: ModelConfig):
    """A ``require`` test, the writers' side of :func:`_gelu_head`."""
    return lambda act: c.head != "mlm" or act == "gelu"


# --- RoBERTa --------------------------------------------------------------------------------
def roberta_to_config(hf: dict) -> ModelConfig:
    hf = {**ROBERTA_DEFAULTS, **hf}
    _gelu_head("roberta", hf, "RobertaForMaskedLM")
    pad = hf["pad_token_id"]
    # RoBERTa's <unk> is 3 in its vocabulary; config.json does not record it
    return _config("roberta", hf, bert_fields(hf, "roberta"), position_offset=pad + 1,
                   pad_id=pad, bos_id=hf["bos_token_id"], eos_id=hf["eos_token_id"], unk_id=3)


def roberta_from_config(c: ModelConfig) -> dict:
    if c.position_offset != c.pad_id + 1:
        raise BadInput(f"position_offset={c.position_offset} has no RoBERTa equivalent (RoBERTa "
                       f"counts positions from pad_id + 1 = {c.pad_id + 1})")
    require(c, "RobertaModel", share_layers=False, embedding_size=None,
            pooler=has_its_pooler(c), type_vocab_size=lambda v: v >= 1, activation=_mlm_gelu(c))
    return {**bert_hf_fields(c, "RobertaModel"), "bos_token_id": c.bos_id,
            "eos_token_id": c.eos_id}


def roberta_weights(c: ModelConfig, model: str = "roberta", layer=BERT_LAYER):
    """RoBERTa's weight names; Longformer's are the same under ``model="longformer"``, its
    ``layer`` with the global tokens' projections added."""
    p = "" if c.head == "none" else f"{model}."
    rows = embedding_rows(f"{p}embeddings")
    rows += linear_rows(layer, "encoder.layers.{i}.", f"{p}encoder.layer.{{i}}.")
    if c.head in ("none", "choice"):  # the multiple-choice head reads RoBERTa's own pooler
        rows += linear_rows([("pooler", f"{p}pooler.dense")])
    if c.head == "mlm":
        rows += linear_rows([("mlm.dense", "lm_head.dense"), ("mlm.norm", "lm_head.layer_norm")])
        rows += [("mlm.weight", "lm_head.decoder.weight"), ("mlm.bias", "lm_head.bias")]
    if c.head == "classify":  # dense + tanh on <s>, then out_proj: BERT's pooler + classifier
        rows += linear_rows([("pooler", "classifier.dense"), ("classifier", "classifier.out_proj")])
    if c.head in ("tokens", "choice"):
        rows += linear_rows([("classifier", "classifier")])
    if c.head == "qa":
        rows += linear_rows([("qa", "qa_outputs")])
    return [(ours, theirs, False) for ours, theirs in rows]


def roberta_alternatives(model: str = "roberta"):
    """The prefix either way; older checkpoints store the MLM bias as lm_head.decoder.bias."""
    with_prefix = prefix_alternatives(f"{model}.")

    def names(name: str) -> list[str]:
        return with_prefix(name) + (["lm_head.decoder.bias"] if name == "lm_head.bias" else [])
    return names


# --- ALBERT ---------------------------------------------------------------------------------
ALBERT_LAYER = _layer("attention.query", "attention.key", "attention.value", "attention.dense",
                      "attention.LayerNorm", "ffn", "ffn_output", "full_layer_layer_norm")


def albert_to_config(hf: dict) -> ModelConfig:
    hf = {**_ALBERT_DEFAULTS, **hf}
    for name in ("num_hidden_groups", "inner_group_num"):  # one shared layer, as published
        if hf.get(name, 1) != 1:
            raise BadInput(f"{name}={hf[name]!r} is not supported for albert (only 1)")
    config = _config("albert", hf, bert_fields(hf, "albert"),
                     embedding_size=hf["embedding_size"], share_layers=True,
                     pad_id=hf["pad_token_id"], unk_id=1, bos_id=hf["bos_token_id"],
                     eos_id=hf["eos_token_id"])
    if config.head == "pretraining" and config.num_labels != 2:  # the sentence-order head
        raise BadInput(f"num_labels={config.num_labels} is not supported for "
                       "AlbertForPreTraining (its sentence-order head has 2)")
    return config


def albert_from_config(c: ModelConfig) -> dict:
    require(c, "AlbertModel", share_layers=True, position_offset=0, pooler=has_its_pooler(c),
            type_vocab_size=lambda v: v >= 1, embedding_size=lambda v: v is not None)
    return {**bert_hf_fields(c, "AlbertModel"), "embedding_size": c.embedding_size or c.d_model,
            "num_hidden_groups": 1, "inner_group_num": 1, "bos_token_id": c.bos_id,
            "eos_token_id": c.eos_id}


def albert_weights(c: ModelConfig):
    p = "" if c.head == "none" else "albert."
    rows = embedding_rows(f"{p}embeddings")
    rows += linear_rows([("embed_proj", f"{p}encoder.embedding_hidden_mapping_in")])
    # the shared layer once: encoder.layers.1, 2, ... are other names for the same tensors
    rows += linear_rows(ALBERT_LAYER, "encoder.layers.0.",
                        f"{p}encoder.albert_layer_groups.0.albert_layers.0.")
    if c.head in ("none", "pretraining", "classify", "choice"):
        rows += linear_rows([("pooler", f"{p}pooler")])
    if c.head in ("mlm", "pretraining"):
        rows += linear_rows([("mlm.dense", "predictions.dense"),
                             ("mlm.norm", "predictions.LayerNorm")])
        rows += [("mlm.weight", "predictions.decoder.weight"), ("mlm.bias", "predictions.bias")]
    if c.head == "pretraining":  # sentence-order prediction on the pooled vector
        rows += linear_rows([("nsp", "sop_classifier.classifier")])
    if c.head in ("classify", "tokens", "choice"):
        rows += linear_rows([("classifier", "classifier")])
    return [(ours, theirs, False) for ours, theirs in rows]


# --- DistilBERT -----------------------------------------------------------------------------
DISTILBERT_LAYER = _layer("attention.q_lin", "attention.k_lin", "attention.v_lin",
                          "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
                          "output_layer_norm")


def distilbert_to_config(hf: dict) -> ModelConfig:
    hf = {**_DISTILBERT_DEFAULTS, **hf}
    if hf.get("sinusoidal_pos_embds"):
        raise BadInput("sinusoidal_pos_embds=True is not supported for distilbert (only "
                       "learned positions)")
    check_absolute_positions(hf)
    fields = dict(
        arch="encoder", vocab_size=hf["vocab_size"], d_model=hf["dim"], n_heads=hf["n_heads"],
        d_ff=hf["hidden_dim"], n_encoder_layers=hf["n_layers"], n_decoder_layers=0,
        dropout=hf["dropout"], attention_dropout=hf["attention_dropout"],
        max_len=hf["max_position_embeddings"], positional="learned",
        norm_eps=1e-12,  # fixed in DistilBERT's code, not in its config
        norm_placement="post", activation=activation_from_hf(hf, "activation", "gelu",
                                                             "distilbert"),
        scale_embeddings=False, type_vocab_size=0, embedding_norm=True)
    return _config("distilbert", hf, fields, pooler=False, pad_id=hf["pad_token_id"],
                   unk_id=100, bos_id=101, eos_id=102)


def distilbert_from_config(c: ModelConfig) -> dict:
    require_bert_shape(c, "DistilBertModel")
    require(c, "DistilBertModel", type_vocab_size=0, pooler=no_pooler(c), share_layers=False,
            position_offset=0, embedding_size=None, norm_eps=1e-12)
    return dict(vocab_size=c.vocab_size, dim=c.d_model, n_heads=c.n_heads, hidden_dim=c.d_ff,
                n_layers=c.n_encoder_layers, max_position_embeddings=c.max_len,
                sinusoidal_pos_embds=False, dropout=c.dropout,
                attention_dropout=c.attention_dropout,
                activation=activation_to_hf(c, "DistilBertModel"), pad_token_id=c.pad_id,
                tie_word_embeddings=True, **labels_to_hf(c))


def distilbert_weights(c: ModelConfig):
    p = "" if c.head == "none" else "distilbert."
    rows = embedding_rows(f"{p}embeddings", segments=False)
    rows += linear_rows(DISTILBERT_LAYER, "encoder.layers.{i}.", f"{p}transformer.layer.{{i}}.")
    if c.head == "mlm":
        rows += linear_rows([("mlm.dense", "vocab_transform"), ("mlm.norm", "vocab_layer_norm")])
        rows += [("mlm.weight", "vocab_projector.weight"), ("mlm.bias", "vocab_projector.bias")]
    if c.head == "tokens":
        rows += linear_rows([("classifier", "classifier")])
    return [(ours, theirs, False) for ours, theirs in rows]


# --- ELECTRA --------------------------------------------------------------------------------
def electra_to_config(hf: dict) -> ModelConfig:
    hf = {**_ELECTRA_DEFAULTS, **hf}
    _gelu_head("electra", hf, "ElectraForMaskedLM")
    e = hf["embedding_size"]
    return _config("electra", hf, bert_fields(hf, "electra"),
                   embedding_size=None if e == hf["hidden_size"] else e, pooler=False,
                   pad_id=hf["pad_token_id"], unk_id=100, bos_id=101, eos_id=102)


def electra_from_config(c: ModelConfig) -> dict:
    require(c, "ElectraModel", pooler=no_pooler(c), share_layers=False, position_offset=0,
            type_vocab_size=lambda v: v >= 1, activation=_mlm_gelu(c))
    return {**bert_hf_fields(c, "ElectraModel"), "embedding_size": c.embedding_size or c.d_model}


def electra_weights(c: ModelConfig):
    p = "" if c.head == "none" else "electra."
    rows = embedding_rows(f"{p}embeddings")
    if c.embedding_size:
        rows += linear_rows([("embed_proj", f"{p}embeddings_project")])
    rows += linear_rows(BERT_LAYER, "encoder.layers.{i}.", f"{p}encoder.layer.{{i}}.")
    if c.head == "discriminator":
        rows += linear_rows([("discriminator.dense", "discriminator_predictions.dense"),
                             ("discriminator.out", "discriminator_predictions.dense_prediction")])
    if c.head == "mlm":  # the generator
        rows += linear_rows([("mlm.dense", "generator_predictions.dense"),
                             ("mlm.norm", "generator_predictions.LayerNorm")])
        rows += [("mlm.weight", "generator_lm_head.weight"), ("mlm.bias", "generator_lm_head.bias")]
    if c.head == "tokens":
        rows += linear_rows([("classifier", "classifier")])
    return [(ours, theirs, False) for ours, theirs in rows]


register(Family("roberta", _class_of("roberta"), roberta_to_config, roberta_from_config,
                roberta_weights, roberta_alternatives()))
register(Family("albert", _class_of("albert"), albert_to_config, albert_from_config,
                albert_weights, prefix_alternatives("albert.")))
register(Family("distilbert", _class_of("distilbert"), distilbert_to_config,
                distilbert_from_config, distilbert_weights, prefix_alternatives("distilbert.")))
register(Family("electra", _class_of("electra"), electra_to_config, electra_from_config,
                electra_weights, prefix_alternatives("electra.")))
