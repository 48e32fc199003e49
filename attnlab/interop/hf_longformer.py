"""Longformer (Beltagy et al., 2020) as Hugging Face stores it, mapped onto attnlab's BERT.

A Longformer is RoBERTa (positions counted from ``pad_token_id + 1``, ``<s>``/``</s>`` ids)
whose self-attention is :class:`attnlab.nn.longformer.LongformerSelfAttention`: a band of
``attention_window`` tokens (one int, or one a layer) and the global tokens, which attend
through their own projections, ``query_global``, ``key_global`` and ``value_global``
(attnlab's ``q_global``, ``k_global``, ``v_global``). The config carries ``attention_window``;
every other field is RoBERTa's.

The heads: ``LongformerModel`` (unprefixed, with its pooler), ``LongformerForMaskedLM``,
``LongformerForSequenceClassification`` (RoBERTa's classifier: ``classifier.dense`` + tanh +
``classifier.out_proj`` on ``<s>``, which is global by default),
``LongformerForTokenClassification`` and ``LongformerForQuestionAnswering`` (the question,
every token before the first ``</s>``, global by default).
"""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.hf_bert import (
    BERT_LAYER,
    bert_fields,
    bert_hf_fields,
    has_its_pooler,
    head_of,
    labels_from_hf,
)
from attnlab.interop.hf_encoders import ROBERTA_DEFAULTS, roberta_alternatives, roberta_weights
from attnlab.interop.huggingface import Family, register, require

# transformers' LongformerConfig defaults, for fields a config.json omits: RoBERTa's, with
# BERT's vocabulary size
_DEFAULTS = dict(ROBERTA_DEFAULTS, vocab_size=30522, attention_window=512)

_CLASSES = {"LongformerModel": "none", "LongformerForMaskedLM": "mlm",
            "LongformerForSequenceClassification": "classify",
            "LongformerForTokenClassification": "tokens",
            "LongformerForQuestionAnswering": "qa"}
_HEADS = {head: cls for cls, head in _CLASSES.items()}

# the global tokens' projections, beside BERT's layer
GLOBAL_PROJECTIONS = [("self_attn.q_global", "attention.self.query_global"),
                      ("self_attn.k_global", "attention.self.key_global"),
                      ("self_attn.v_global", "attention.self.value_global")]


def longformer_class(c: ModelConfig) -> str:
    if c.head not in _HEADS:
        raise BadInput(f"head={c.head!r} has no longformer class (heads: {sorted(_HEADS)})")
    return _HEADS[c.head]


def longformer_to_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    head = head_of(hf, _CLASSES, "longformer")
    act = hf.get("hidden_act", "gelu")
    if head == "mlm" and act != "gelu":  # its LM head applies GELU whatever hidden_act says
        raise BadInput(f"hidden_act={act!r} is not supported for LongformerForMaskedLM (its "
                       "MLM head is always 'gelu')")
    sep = hf.get("sep_token_id", hf["eos_token_id"])
    if head == "qa" and sep != hf["eos_token_id"]:  # the question ends at attnlab's eos_id
        raise BadInput(f"sep_token_id={sep!r} differs from eos_token_id="
                       f"{hf['eos_token_id']!r}: not supported for LongformerForQuestionAnswering")
    extra = {"hf_model_type": "longformer"}
    pad = hf["pad_token_id"]
    return ModelConfig(**bert_fields(hf, "longformer"), attention_window=hf["attention_window"],
                       position_offset=pad + 1, head=head, num_labels=labels_from_hf(hf, extra),
                       pad_id=pad, unk_id=3, bos_id=hf["bos_token_id"],
                       eos_id=hf["eos_token_id"], extra=extra)


def longformer_from_config(c: ModelConfig) -> dict:
    if c.position_offset != c.pad_id + 1:
        raise BadInput(f"position_offset={c.position_offset} has no Longformer equivalent (it "
                       f"counts positions from pad_id + 1 = {c.pad_id + 1})")
    require(c, "LongformerModel", attention_window=lambda w: w is not None, share_layers=False,
            embedding_size=None, pooler=has_its_pooler(c), type_vocab_size=lambda v: v >= 1,
            activation=lambda act: c.head != "mlm" or act == "gelu")
    return {**bert_hf_fields(c, "LongformerModel"), "attention_window": c.attention_window,
            "bos_token_id": c.bos_id, "eos_token_id": c.eos_id, "sep_token_id": c.eos_id}


def longformer_weights(c: ModelConfig):
    return roberta_weights(c, "longformer", BERT_LAYER + GLOBAL_PROJECTIONS)


register(Family("longformer", longformer_class, longformer_to_config, longformer_from_config,
                longformer_weights, roberta_alternatives("longformer")))
