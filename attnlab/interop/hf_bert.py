"""BERT as Hugging Face stores it, mapped onto attnlab's BERT.

The transformers class follows the head: ``BertModel`` (weights unprefixed, with the pooler),
``BertForMaskedLM`` / ``BertForTokenClassification`` (``bert.`` prefix, no pooler),
``BertForPreTraining`` / ``BertForSequenceClassification`` (``bert.`` prefix, pooler). Some
checkpoints store a bare encoder with the prefix, or a headed one without; both are accepted.

The pieces every BERT-shaped family shares (the layer's weight names, the embeddings, the
labels, the optional prefix) are here too, for :mod:`attnlab.interop.hf_encoders`.
"""

from __future__ import annotations

from collections.abc import Callable

from attnlab.config import POOLED_HEADS, ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.huggingface import (
    Family,
    activation_from_hf,
    activation_to_hf,
    register,
    require,
)

_CLASSES = {"BertModel": "none", "BertForMaskedLM": "mlm", "BertForPreTraining": "pretraining",
            "BertForSequenceClassification": "classify", "BertForTokenClassification": "tokens",
            "BertForQuestionAnswering": "qa", "BertForMultipleChoice": "choice"}
_HEADS = {head: cls for cls, head in _CLASSES.items()}

# transformers' BertConfig defaults, for fields a config.json may leave out
_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, num_hidden_layers=12)

# one BERT layer (also RoBERTa's and ELECTRA's): attnlab's module -> transformers' module
BERT_LAYER = [
    ("self_attn.q_proj", "attention.self.query"), ("self_attn.k_proj", "attention.self.key"),
    ("self_attn.v_proj", "attention.self.value"),
    ("self_attn.out_proj", "attention.output.dense"),
    ("attn_sublayer.norm", "attention.output.LayerNorm"),
    ("ffn.w1", "intermediate.dense"), ("ffn.w2", "output.dense"),
    ("ffn_sublayer.norm", "output.LayerNorm"),
]


def linear_rows(pairs: list[tuple[str, str]], ours: str = "",
                theirs: str = "") -> list[tuple[str, str]]:
    """``(ours.module.weight, theirs.module.weight)`` and the biases, for modules given as
    ``(ours, theirs)`` names under the prefixes ``ours`` and ``theirs``."""
    return [(f"{ours}{a}.{kind}", f"{theirs}{b}.{kind}")
            for a, b in pairs for kind in ("weight", "bias")]


def embedding_rows(e: str, segments: bool = True) -> list[tuple[str, str]]:
    """The embedding sum and its LayerNorm under transformers' ``e`` (``bert.embeddings``)."""
    rows = [("embed.weight", f"{e}.word_embeddings.weight"),
            ("positional.weight", f"{e}.position_embeddings.weight")]
    if segments:
        rows.append(("segment.weight", f"{e}.token_type_embeddings.weight"))
    return rows + linear_rows([("embed_norm", "LayerNorm")], theirs=f"{e}.")


def check_absolute_positions(hf: dict) -> None:
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise BadInput(f"position_embedding_type={kind!r} is not supported (only 'absolute')")


def head_of(hf: dict, classes: dict[str, str], family: str) -> str:
    """attnlab's head for the class config.json names (the first class when none is named)."""
    arch = (hf.get("architectures") or [next(iter(classes))])[0]
    if arch not in classes:
        raise BadInput(f"architectures={arch!r} is not supported for {family} "
                       f"(supported: {sorted(classes)})")
    return classes[arch]


def labels_from_hf(hf: dict, extra: dict) -> int:
    """The label names of ``id2label`` into ``extra["labels"]``; returns the label count."""
    labels = hf.get("id2label")
    if not labels:
        return hf.get("num_labels", 2)
    extra["labels"] = [labels[str(i)] if str(i) in labels else labels[i]
                       for i in range(len(labels))]
    return len(labels)


def labels_to_hf(c: ModelConfig) -> dict:
    labels = c.extra.get("labels") or [f"LABEL_{i}" for i in range(c.num_labels)]
    return dict(id2label={str(i): name for i, name in enumerate(labels)},
                label2id={name: i for i, name in enumerate(labels)})


def bert_fields(hf: dict, family: str) -> dict:
    """ModelConfig fields from the config.json fields that every BertConfig-shaped family
    (BERT, RoBERTa, ALBERT, ELECTRA) spells alike: a post-LN encoder with learned positions
    and a LayerNorm on the embedding sum."""
    check_absolute_positions(hf)
    return dict(
        arch="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        n_encoder_layers=hf["num_hidden_layers"], n_decoder_layers=0,
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        max_len=hf.get("max_position_embeddings", 512), positional="learned",
        norm_eps=hf.get("layer_norm_eps", 1e-12), norm_placement="post",
        activation=activation_from_hf(hf, "hidden_act", "gelu", family),
        scale_embeddings=False, type_vocab_size=hf.get("type_vocab_size", 2),
        embedding_norm=True)


def bert_hf_fields(c: ModelConfig, family: str) -> dict:
    """The config.json fields :func:`bert_fields` reads, from a config (``family``: the
    transformers class, for errors); the parts every BERT-shaped family stores alike are
    checked first."""
    require_bert_shape(c, family)
    return dict(vocab_size=c.vocab_size, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                intermediate_size=c.d_ff, num_hidden_layers=c.n_encoder_layers,
                hidden_act=activation_to_hf(c, family), hidden_dropout_prob=c.dropout,
                attention_probs_dropout_prob=c.attention_dropout,
                max_position_embeddings=c.max_len, type_vocab_size=c.type_vocab_size,
                layer_norm_eps=c.norm_eps, pad_token_id=c.pad_id,
                position_embedding_type="absolute", tie_word_embeddings=True,
                **labels_to_hf(c))


def has_its_pooler(c: ModelConfig):
    """A ``require`` test: a head that reads the pooler (BERT, RoBERTa, ALBERT) has one."""
    return lambda pooler: pooler or c.head not in POOLED_HEADS


def no_pooler(c: ModelConfig):
    """A ``require`` test: no pooler where the head would read one (DistilBERT, ELECTRA)."""
    return lambda pooler: not pooler or c.head not in POOLED_HEADS


def require_bert_shape(c: ModelConfig, cls: str) -> None:
    """What BERT and its descendants share: post-LN LayerNorm with biases, learned absolute
    positions, a normed embedding sum, separate Q/K/V projections scaled by 1/√d_k."""
    require(c, cls, positional="learned", norm="layernorm", norm_placement="post",
            use_final_norm=False, bias=True, embedding_norm=True, fused_qkv=False,
            scale_attention=True, head_dim=None, kv_heads=c.n_heads, scale_embeddings=False,
            attention_window=lambda w: w is None or cls.startswith("Longformer"))


def bert_to_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    extra = {"hf_model_type": "bert"}
    head = head_of(hf, _CLASSES, "bert")
    return ModelConfig(**bert_fields(hf, "bert"), head=head,
                       num_labels=labels_from_hf(hf, extra), pad_id=hf.get("pad_token_id") or 0,
                       unk_id=100, bos_id=101, eos_id=102, extra=extra)


def bert_from_config(c: ModelConfig) -> dict:
    require(c, "BertModel", position_offset=0, share_layers=False, embedding_size=None,
            pooler=has_its_pooler(c), type_vocab_size=lambda v: v >= 1)
    return bert_hf_fields(c, "BertModel")


def bert_class(c: ModelConfig) -> str:
    return _HEADS[c.head]


def bert_weights(c: ModelConfig):
    p = "" if c.head == "none" else "bert."
    rows = embedding_rows(f"{p}embeddings")
    rows += linear_rows(BERT_LAYER, "encoder.layers.{i}.", f"{p}encoder.layer.{{i}}.")
    if c.head in POOLED_HEADS:
        rows += linear_rows([("pooler", f"{p}pooler.dense")])
    if c.head in ("mlm", "pretraining"):
        t = "cls.predictions.transform"
        rows += linear_rows([("mlm.dense", f"{t}.dense"), ("mlm.norm", f"{t}.LayerNorm")])
        rows += [("mlm.weight", "cls.predictions.decoder.weight"),  # tied: usually not stored
                 ("mlm.bias", "cls.predictions.bias")]
    if c.head == "pretraining":
        rows += linear_rows([("nsp", "cls.seq_relationship")])
    if c.head in ("classify", "tokens", "choice"):  # choice: one logit, Linear(d, 1)
        rows += linear_rows([("classifier", "classifier")])
    if c.head == "qa":
        rows += linear_rows([("qa", "qa_outputs")])
    return [(ours, theirs, False) for ours, theirs in rows]


def prefix_alternatives(prefix: str) -> Callable[[str], list[str]]:
    """Other spellings of a weight's name: with or without the family's ``prefix``
    (``"bert."``), and the TensorFlow-era ``LayerNorm.gamma`` / ``LayerNorm.beta`` of older
    checkpoints."""
    def toggle(name: str) -> str:
        return name.removeprefix(prefix) if name.startswith(prefix) else prefix + name

    def alternatives(name: str) -> list[str]:
        names = [toggle(name)]
        if "LayerNorm." in name:
            old = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                               "LayerNorm.beta")
            names += [old, toggle(old)]
        return names

    return alternatives


register(Family("bert", bert_class, bert_to_config, bert_from_config, bert_weights,
                prefix_alternatives("bert.")))
