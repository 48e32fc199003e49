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
    embedding_rows,
    has_its_pooler,
    head_of,
    labels_from_hf,
    linear_rows,
    prefix_alternatives,
)
from attnlab.interop.huggingface import Family, register, require

# transformers' LongformerConfig defaults, for fields a config.json omits
_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, num_hidden_layers=12, attention_window=512,
                 pad_token_id=1, bos_token_id=0, eos_token_id=2)

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
    p = "" if c.head == "none" else "longformer."
    rows = embedding_rows(f"{p}embeddings")
    rows += linear_rows(BERT_LAYER + GLOBAL_PROJECTIONS, "encoder.layers.{i}.",
                        f"{p}encoder.layer.{{i}}.")
    if c.head == "none":
        rows += linear_rows([("pooler", f"{p}pooler.dense")])
    if c.head == "mlm":
        rows += linear_rows([("mlm.dense", "lm_head.dense"), ("mlm.norm", "lm_head.layer_norm")])
        rows += [("mlm.weight", "lm_head.decoder.weight"), ("mlm.bias", "lm_head.bias")]
    if c.head == "classify":  # dense + tanh on <s>, then out_proj: BERT's pooler + classifier
        rows += linear_rows([("pooler", "classifier.dense"), ("classifier", "classifier.out_proj")])
    if c.head == "tokens":
        rows += linear_rows([("classifier", "classifier")])
    if c.head == "qa":
        rows += linear_rows([("qa", "qa_outputs")])
    return [(ours, theirs, False) for ours, theirs in rows]


def _alternatives(name: str) -> list[str]:
    """The prefix either way; the MLM bias may be stored as lm_head.decoder.bias."""
    names = prefix_alternatives("longformer.")(name)
    return names + (["lm_head.decoder.bias"] if name == "lm_head.bias" else [])


register(Family("longformer", longformer_class, longformer_to_config, longformer_from_config,
                longformer_weights, _alternatives))
