"""The Vision Transformer as Hugging Face stores it (``model_type: "vit"``), mapped onto
attnlab's :class:`~attnlab.models.ViT`.

The transformers class follows the head: ``ViTForImageClassification`` (``vit.`` prefix, a
``classifier`` on the final-normed [CLS] vector, no pooler) for ``classify``, ``ViTModel``
(unprefixed) for ``none``. A ``ViTModel`` checkpoint also stores a tanh pooler, which attnlab
does not use and leaves unread; a folder written back for ``none`` has none, so transformers
initialises it anew (the hidden states are unaffected). Checkpoints that store a bare model
with the prefix, or a headed one without, are accepted.

``qkv_bias: false`` (no biases on query, key and value; the other layers keep theirs) is the
config's ``qkv_bias``. Not supported, each refused with one error: masked image modelling
(``ViTForMaskedImageModeling``, SimMIM's ``encoder_stride`` decoder), non-square images or
patches. Position interpolation to other image sizes is a forward
option of transformers, not part of a checkpoint: attnlab runs images of ``image_size`` only.
"""

from __future__ import annotations

import dataclasses

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.huggingface import (
    Family,
    activation_from_hf,
    activation_to_hf,
    register,
)

_CLASSES = {"ViTModel": "none", "ViTForImageClassification": "classify"}
_HEADS = {head: cls for cls, head in _CLASSES.items()}

# transformers' ViTConfig defaults (ViT-B/16), for fields a config.json may leave out
_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, image_size=224,
                 patch_size=16, num_channels=3, qkv_bias=True)


def _side(hf: dict, field: str) -> int:
    """A square size: an int, or a list of two equal ints (transformers allows both)."""
    value = hf[field]
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise BadInput(f"{field}={value!r}: only square images and patches are supported")
        value = value[0]
    return value


def _labels(hf: dict) -> list[str] | None:
    labels = hf.get("id2label")
    if not labels:
        return None
    if not isinstance(labels, dict):
        raise BadInput(f"id2label must be an object, got {type(labels).__name__}")
    return [str(labels[str(i)] if str(i) in labels else labels[i]) for i in range(len(labels))]


def vit_to_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    arch = (hf.get("architectures") or ["ViTModel"])[0]
    if arch == "ViTForMaskedImageModeling":
        raise BadInput("architectures='ViTForMaskedImageModeling' (masked image modelling, "
                       "an encoder_stride decoder) is not supported: only ViTModel and "
                       "ViTForImageClassification")
    if arch not in _CLASSES:
        raise BadInput(f"architectures={arch!r} is not supported for vit "
                       f"(supported: {sorted(_CLASSES)})")
    act = activation_from_hf(hf, "hidden_act", "gelu", "vit")
    image_size, patch_size = _side(hf, "image_size"), _side(hf, "patch_size")
    labels = _labels(hf)
    extra: dict = {"hf_model_type": "vit"}
    if labels:
        extra["labels"] = labels
    config = ModelConfig(
        arch="vision", d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], n_encoder_layers=hf["num_hidden_layers"],
        n_decoder_layers=0, dropout=hf["hidden_dropout_prob"],
        attention_dropout=hf["attention_probs_dropout_prob"],
        positional="learned", norm_eps=hf["layer_norm_eps"], norm_placement="pre",
        activation=act, scale_embeddings=False, head=_CLASSES[arch],
        num_labels=len(labels) if labels else hf.get("num_labels", 2),
        image_size=image_size, patch_size=patch_size, num_channels=hf["num_channels"],
        qkv_bias=None if hf["qkv_bias"] is True else hf["qkv_bias"], extra=extra,
    )
    return dataclasses.replace(config, max_len=config.n_patches + 1)  # [CLS] + the patches


def vit_from_config(c: ModelConfig) -> dict:
    """config.json for ``c``; a config transformers' ViT cannot express is an error."""
    differences = [
        (c.norm != "layernorm", f"norm={c.norm!r}"),
        (c.norm_placement != "pre", f"norm_placement={c.norm_placement!r}"),
        (not c.use_final_norm, "final_norm=False"),
        (not c.bias, "bias=False"),
        (c.kv_heads != c.n_heads, f"num_kv_heads={c.num_kv_heads}"),
        (c.fused_qkv, "fused_qkv=True"),
    ]
    for differs, what in differences:
        if differs:
            raise BadInput(f"{what} has no ViTModel equivalent (pre-LN LayerNorm blocks with "
                           "biases and one key/value head per query head)")
    act = activation_to_hf(c, "ViTModel")
    labels = c.extra.get("labels") or [f"LABEL_{i}" for i in range(c.num_labels)]
    return dict(hidden_size=c.d_model, num_hidden_layers=c.n_encoder_layers,
                num_attention_heads=c.n_heads, intermediate_size=c.d_ff, hidden_act=act,
                hidden_dropout_prob=c.dropout,
                attention_probs_dropout_prob=c.attention_dropout, initializer_range=0.02,
                layer_norm_eps=c.norm_eps, image_size=c.image_size, patch_size=c.patch_size,
                num_channels=c.num_channels, qkv_bias=c.biased_qkv, encoder_stride=c.patch_size,
                id2label={str(i): name for i, name in enumerate(labels)},
                label2id={name: i for i, name in enumerate(labels)})


def vit_class(c: ModelConfig) -> str:
    return _HEADS[c.head]


def vit_weights(c: ModelConfig):
    p = "" if c.head == "none" else "vit."
    e, layer = f"{p}embeddings", f"{p}encoder.layer.{{i}}"
    rows = [("patch_embed.projection.weight", f"{e}.patch_embeddings.projection.weight"),
            ("patch_embed.projection.bias", f"{e}.patch_embeddings.projection.bias"),
            ("patch_embed.cls", f"{e}.cls_token"),
            ("patch_embed.positions", f"{e}.position_embeddings")]
    for ours, theirs in [
        ("self_attn.q_proj", "attention.attention.query"),
        ("self_attn.k_proj", "attention.attention.key"),
        ("self_attn.v_proj", "attention.attention.value"),
        ("self_attn.out_proj", "attention.output.dense"),
        ("attn_sublayer.norm", "layernorm_before"),
        ("ffn.w1", "intermediate.dense"), ("ffn.w2", "output.dense"),
        ("ffn_sublayer.norm", "layernorm_after"),
    ]:
        for kind in ("weight", "bias"):
            if kind == "bias" and ours[-6:] in ("q_proj", "k_proj", "v_proj") \
                    and not c.biased_qkv:
                continue
            rows.append((f"encoder.layers.{{i}}.{ours}.{kind}", f"{layer}.{theirs}.{kind}"))
    rows += [("encoder.norm.weight", f"{p}layernorm.weight"),
             ("encoder.norm.bias", f"{p}layernorm.bias")]
    if c.head == "classify":
        rows += [("classifier.weight", "classifier.weight"),
                 ("classifier.bias", "classifier.bias")]
    return [(ours, theirs, False) for ours, theirs in rows]


def _with_or_without_prefix(name: str) -> list[str]:
    """The other spelling of a weight's name: with or without the ``vit.`` prefix."""
    if name.startswith("vit."):
        return [name.removeprefix("vit.")]
    return [] if name.startswith("classifier.") else [f"vit.{name}"]


register(Family("vit", vit_class, vit_to_config, vit_from_config, vit_weights,
                _with_or_without_prefix))
