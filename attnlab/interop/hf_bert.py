"""BERT as Hugging Face stores it, mapped onto attnlab's BERT.

The transformers class follows the head: ``BertModel`` (weights unprefixed, with the pooler),
``BertForMaskedLM`` / ``BertForTokenClassification`` (``bert.`` prefix, no pooler),
``BertForPreTraining`` / ``BertForSequenceClassification`` (``bert.`` prefix, pooler). Some
checkpoints store a bare encoder with the prefix, or a headed one without; both are accepted.
"""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.huggingface import (
    Family,
    activation_from_hf,
    activation_to_hf,
    register,
)

_CLASSES = {"BertModel": "none", "BertForMaskedLM": "mlm", "BertForPreTraining": "pretraining",
            "BertForSequenceClassification": "classify", "BertForTokenClassification": "tokens"}
_HEADS = {head: cls for cls, head in _CLASSES.items()}

# transformers' BertConfig defaults, for fields a config.json may leave out
_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, num_hidden_layers=12)


def bert_to_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    act = activation_from_hf(hf, "hidden_act", "gelu", "bert")
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise BadInput(f"position_embedding_type={kind!r} is not supported "
                       "(only 'absolute')")
    arch = (hf.get("architectures") or ["BertModel"])[0]
    if arch not in _CLASSES:
        raise BadInput(f"architectures={arch!r} is not supported for bert "
                       f"(supported: {sorted(_CLASSES)})")
    labels = hf.get("id2label")
    extra = {"hf_model_type": "bert"}
    if labels:
        extra["labels"] = [labels[str(i)] if str(i) in labels else labels[i]
                           for i in range(len(labels))]
    return ModelConfig(
        arch="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        n_encoder_layers=hf["num_hidden_layers"], n_decoder_layers=0,
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        max_len=hf.get("max_position_embeddings", 512), positional="learned",
        norm_eps=hf.get("layer_norm_eps", 1e-12), norm_placement="post", activation=act,
        scale_embeddings=False, type_vocab_size=hf.get("type_vocab_size", 2),
        embedding_norm=True, head=_CLASSES[arch],
        num_labels=len(labels) if labels else hf.get("num_labels", 2),
        pad_id=hf.get("pad_token_id") or 0, unk_id=100, bos_id=101, eos_id=102, extra=extra,
    )


def bert_from_config(c: ModelConfig) -> dict:
    act = activation_to_hf(c, "BertModel")
    labels = c.extra.get("labels") or [f"LABEL_{i}" for i in range(c.num_labels)]
    return dict(vocab_size=c.vocab_size, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                intermediate_size=c.d_ff, num_hidden_layers=c.n_encoder_layers,
                hidden_act=act, hidden_dropout_prob=c.dropout,
                attention_probs_dropout_prob=c.attention_dropout,
                max_position_embeddings=c.max_len, type_vocab_size=c.type_vocab_size,
                layer_norm_eps=c.norm_eps, pad_token_id=c.pad_id,
                position_embedding_type="absolute", tie_word_embeddings=True,
                id2label={str(i): name for i, name in enumerate(labels)},
                label2id={name: i for i, name in enumerate(labels)})


def bert_class(c: ModelConfig) -> str:
    return _HEADS[c.head]


def bert_weights(c: ModelConfig):
    p = "" if c.head == "none" else "bert."
    e, layer = f"{p}embeddings", f"{p}encoder.layer.{{i}}"
    rows = [("embed.weight", f"{e}.word_embeddings.weight"),
            ("positional.weight", f"{e}.position_embeddings.weight"),
            ("segment.weight", f"{e}.token_type_embeddings.weight"),
            ("embed_norm.weight", f"{e}.LayerNorm.weight"),
            ("embed_norm.bias", f"{e}.LayerNorm.bias")]
    for ours, theirs in [
        ("self_attn.q_proj", "attention.self.query"), ("self_attn.k_proj", "attention.self.key"),
        ("self_attn.v_proj", "attention.self.value"),
        ("self_attn.out_proj", "attention.output.dense"),
        ("attn_sublayer.norm", "attention.output.LayerNorm"),
        ("ffn.w1", "intermediate.dense"), ("ffn.w2", "output.dense"),
        ("ffn_sublayer.norm", "output.LayerNorm"),
    ]:
        for kind in ("weight", "bias"):
            rows.append((f"encoder.layers.{{i}}.{ours}.{kind}", f"{layer}.{theirs}.{kind}"))
    if c.head in ("none", "pretraining", "classify"):
        rows += [("pooler.weight", f"{p}pooler.dense.weight"),
                 ("pooler.bias", f"{p}pooler.dense.bias")]
    if c.head in ("mlm", "pretraining"):
        t = "cls.predictions.transform"
        rows += [("mlm.dense.weight", f"{t}.dense.weight"), ("mlm.dense.bias", f"{t}.dense.bias"),
                 ("mlm.norm.weight", f"{t}.LayerNorm.weight"),
                 ("mlm.norm.bias", f"{t}.LayerNorm.bias"),
                 ("mlm.weight", "cls.predictions.decoder.weight"),  # tied: usually not stored
                 ("mlm.bias", "cls.predictions.bias")]
    if c.head == "pretraining":
        rows += [("nsp.weight", "cls.seq_relationship.weight"),
                 ("nsp.bias", "cls.seq_relationship.bias")]
    if c.head in ("classify", "tokens"):
        rows += [("classifier.weight", "classifier.weight"),
                 ("classifier.bias", "classifier.bias")]
    return [(ours, theirs, False) for ours, theirs in rows]


def _with_or_without_prefix(name: str) -> list[str]:
    """Other spellings of a weight's name: with or without the ``bert.`` prefix, and the
    TensorFlow-era ``LayerNorm.gamma`` / ``LayerNorm.beta`` of older checkpoints."""
    names = [name.removeprefix("bert.") if name.startswith("bert.") else f"bert.{name}"]
    if "LayerNorm." in name:
        old = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                           "LayerNorm.beta")
        names += [old, *([old.removeprefix("bert.")] if old.startswith("bert.")
                         else [f"bert.{old}"])]
    return names


register(Family("bert", bert_class, bert_to_config, bert_from_config, bert_weights,
                _with_or_without_prefix))
