"""T5ForConditionalGeneration (Raffel et al., 2020; v1.0, and v1.1 / Flan-T5) mapped onto
attnlab's Transformer: pre-LN with RMSNorm (T5LayerNorm) and a final norm in each stack, no
biases, unscaled embeddings shared by encoder and decoder, no 1/√d_k on the scores, and a
bucketed relative position bias (``positional="relative"``) learned separately by the encoder
(bidirectional) and the decoder (causal), stored in each stack's layer 0.

v1.0 uses ReLU and a tied output projection scaled by d^-½; v1.1 and Flan-T5 use a gated GELU
(``geglu``), an untied ``lm_head`` without that scale, and heads of ``d_kv`` with
``num_heads·d_kv ≠ d_model``. Decoding starts from ``decoder_start_token_id`` (the pad id, 0)
and ends at eos (1).

Whether the head is tied: transformers 4 writes ``tie_word_embeddings``; transformers 5 always
writes ``tie_word_embeddings=true`` and says ``scale_decoder_outputs=false`` for an untied
(v1.1) model, whose ``lm_head.weight`` it stores only when it differs from the embeddings. So an
unscaled model is untied here, and its head is read from ``shared.weight`` when the file has no
``lm_head.weight``.
"""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.huggingface import Family, register

# T5's feed_forward_proj -> attnlab's activation ("gated-gelu" is GELU's tanh form, gelu_new;
# plain "gelu" is the exact one, as transformers' ACT2FN reads it), and back.
FEED_FORWARD = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu", "gated-silu": "swiglu"}
TO_FEED_FORWARD = {ours: theirs for theirs, ours in FEED_FORWARD.items()}


def _one_id(hf: dict, field: str, default: int) -> int:
    value = hf.get(field, default)
    if isinstance(value, list):  # transformers 5 allows a list of eos ids
        if len(value) != 1:
            raise BadInput(f"{field}={value!r}: attnlab decodes with one id")
        value = value[0]
    return default if value is None else value


# transformers' T5Config defaults (t5-small), for fields a config.json may leave out
_DEFAULTS = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8)


def t5_to_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **hf}
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in FEED_FORWARD:
        raise BadInput(f"feed_forward_proj={proj!r} is not supported for t5 "
                       f"(supported: {sorted(FEED_FORWARD)})")
    tied = hf.get("tie_word_embeddings", True) is not False
    scaled = bool(hf.get("scale_decoder_outputs", tied))
    pad = _one_id(hf, "pad_token_id", 0)
    dropout = hf.get("dropout_rate", 0.1)
    return ModelConfig(
        arch="encoder-decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        n_heads=hf["num_heads"], head_dim=hf["d_kv"], d_ff=hf["d_ff"],
        n_encoder_layers=hf["num_layers"],
        n_decoder_layers=hf["num_layers"] if hf.get("num_decoder_layers") is None
        else hf["num_decoder_layers"],
        # T5 has one dropout rate: sublayer outputs, attention weights, inside the FFN
        dropout=dropout, attention_dropout=dropout, activation_dropout=dropout,
        max_len=hf.get("n_positions", 512),  # only a default length: the bias extrapolates
        positional="relative", relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        scale_attention=False, norm="rmsnorm", norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        norm_placement="pre", final_norm=True, activation=FEED_FORWARD[proj], bias=False,
        scale_embeddings=False, tie_embeddings=tied and scaled, share_embeddings=True,
        scale_tied_logits=scaled,
        pad_id=pad, unk_id=_one_id(hf, "unk_token_id", 2),
        bos_id=_one_id(hf, "decoder_start_token_id", pad), eos_id=_one_id(hf, "eos_token_id", 1),
        extra={"hf_model_type": "t5"},
    )


def _check_t5(c: ModelConfig) -> None:
    """A one-line BadInput unless ``c`` is a T5 (checked before any weight is written)."""
    t5_like = (c.positional == "relative" and c.norm == "rmsnorm" and c.pre_norm
               and c.use_final_norm and not c.bias and not c.scale_attention
               and not c.scale_embeddings and not c.fused_qkv and not c.output_bias
               and c.kv_heads == c.n_heads and c.tgt_vocab_size is None
               and (c.tie_embeddings or c.share_embeddings) and c.activation in TO_FEED_FORWARD)
    if not t5_like:
        raise BadInput("this configuration has no T5ForConditionalGeneration equivalent (T5 "
                       "needs positional='relative', pre-LN RMSNorm with a final norm, no "
                       "biases, unscaled scores and embeddings, one vocabulary in one embedding "
                       f"matrix, activation in {sorted(TO_FEED_FORWARD)})")


def t5_from_config(c: ModelConfig) -> dict:
    _check_t5(c)
    return dict(vocab_size=c.vocab_size, d_model=c.d_model, d_kv=c.d_k, d_ff=c.d_ff,
                num_layers=c.n_encoder_layers, num_decoder_layers=c.n_decoder_layers,
                num_heads=c.n_heads, relative_attention_num_buckets=c.relative_buckets,
                relative_attention_max_distance=c.relative_max_distance,
                dropout_rate=c.dropout, layer_norm_epsilon=c.norm_eps,
                feed_forward_proj=TO_FEED_FORWARD[c.activation], n_positions=c.max_len,
                tie_word_embeddings=c.tie_embeddings, scale_decoder_outputs=c.scale_tied_logits,
                is_encoder_decoder=True, pad_token_id=c.pad_id, eos_token_id=c.eos_id,
                decoder_start_token_id=c.bos_id)


def t5_weights(c: ModelConfig):
    _check_t5(c)
    # one embedding matrix for both stacks (attnlab's tgt_embed is src_embed: one vocabulary)
    rows = [("src_embed.weight", "shared.weight", False),
            ("lm_head.weight", "lm_head.weight", False),
            # the relative bias tables: one per stack, kept in its first layer
            ("positional.embedding.weight",
             "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", False),
            ("tgt_positional.embedding.weight",
             "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", False),
            ("encoder.norm.weight", "encoder.final_layer_norm.weight", False),
            ("decoder.norm.weight", "decoder.final_layer_norm.weight", False)]
    gated = c.activation in ("geglu", "swiglu")
    ffn = [("w1", "wi_0" if gated else "wi"), ("w2", "wo")] + ([("w3", "wi_1")] if gated else [])
    attention = [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")]
    encoder = [("self_attn", "layer.0.SelfAttention", attention),
               ("attn_sublayer.norm", "layer.0.layer_norm", None),
               ("ffn", "layer.1.DenseReluDense", ffn),
               ("ffn_sublayer.norm", "layer.1.layer_norm", None)]
    decoder = [("self_attn", "layer.0.SelfAttention", attention),
               ("attn_sublayer.norm", "layer.0.layer_norm", None),
               ("cross_attn", "layer.1.EncDecAttention", attention),
               ("cross_sublayer.norm", "layer.1.layer_norm", None),
               ("ffn", "layer.2.DenseReluDense", ffn),
               ("ffn_sublayer.norm", "layer.2.layer_norm", None)]
    for side, subs in (("encoder", encoder), ("decoder", decoder)):
        for ours, theirs, inner in subs:
            for o, t in (inner or [("", "")]):
                a = f"{side}.layers.{{i}}.{ours}{'.' + o if o else ''}.weight"
                b = f"{side}.block.{{i}}.{theirs}{'.' + t if t else ''}.weight"
                rows.append((a, b, False))
    return rows


def t5_alternatives(name: str) -> list[str]:
    # a folder that says untied but stores no lm_head: the head is the embedding matrix
    return ["shared.weight"] if name == "lm_head.weight" else []


register(Family("t5", "T5ForConditionalGeneration", t5_to_config, t5_from_config, t5_weights,
                t5_alternatives))
