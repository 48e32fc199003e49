"""MarianMTModel (Hugging Face's encoder–decoder closest to the paper) mapped onto attnlab's
Transformer: post-LN layers, sinusoidal positions (stored sines-then-cosines:
``positional="sinusoidal-split"``), embeddings shared by encoder, decoder and output projection,
and an output bias (``final_logits_bias``). Decoding starts from ``decoder_start_token_id``,
which Marian sets to the pad id.
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


def _same(hf: dict, a: str, b: str):
    if hf.get(a) != hf.get(b):
        raise BadInput(f"{a}={hf.get(a)!r} and {b}={hf.get(b)!r} differ "
                       "(attnlab's encoder and decoder share one width)")
    return hf[a]


def marian_to_config(hf: dict) -> ModelConfig:
    act = activation_from_hf(hf, "activation_function", "gelu", "marian")
    if not hf.get("share_encoder_decoder_embeddings", True):
        raise BadInput("share_encoder_decoder_embeddings=False is not supported")
    if hf.get("normalize_before", False):
        raise BadInput("normalize_before=True is not supported (Marian is "
                       "post-LN)")
    pad = hf.get("pad_token_id", hf["vocab_size"] - 1)
    return ModelConfig(
        arch="encoder-decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0),
        max_len=hf.get("max_position_embeddings", 1024), positional="sinusoidal-split",
        norm_eps=1e-5, norm_placement="post", final_norm=False, activation=act,
        scale_embeddings=bool(hf.get("scale_embedding", False)), tie_embeddings=True,
        output_bias=True, pad_id=pad, unk_id=hf.get("unk_token_id", 1),
        bos_id=hf.get("decoder_start_token_id", pad), eos_id=hf.get("eos_token_id", 0),
        extra={"hf_model_type": "marian"},
    )


def marian_from_config(c: ModelConfig) -> dict:
    act = activation_to_hf(c, "MarianMTModel")
    if c.norm_placement != "post" or c.use_final_norm:
        raise BadInput(f"this configuration has no MarianMTModel equivalent (activation "
                       f"{c.activation}, {c.norm_placement}-LN, final norm "
                       f"{c.use_final_norm})")
    if c.positional != "sinusoidal-split" or not c.tie_embeddings or c.tgt_vocab_size:
        raise BadInput("a MarianMTModel needs positional='sinusoidal-split' and one shared, "
                       "tied vocabulary")
    return dict(vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model,
                encoder_layers=c.n_encoder_layers, decoder_layers=c.n_decoder_layers,
                encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
                encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, dropout=c.dropout,
                attention_dropout=c.attention_dropout, activation_dropout=c.activation_dropout,
                activation_function=act, max_position_embeddings=c.max_len,
                scale_embedding=c.scale_embeddings, share_encoder_decoder_embeddings=True,
                tie_word_embeddings=True, pad_token_id=c.pad_id, eos_token_id=c.eos_id,
                decoder_start_token_id=c.bos_id, bad_words_ids=[[c.pad_id]],
                forced_eos_token_id=None)  # as attnlab decodes: never pad, no forced eos


def marian_weights(c: ModelConfig):
    rows = [("src_embed.weight", "model.shared.weight", False),
            ("lm_head.weight", "lm_head.weight", False),  # tied: usually not stored
            ("lm_head.bias", "final_logits_bias", "row")]  # stored as (1, vocab)
    attention = [("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                 ("out_proj", "out_proj")]
    for side, theirs_side, subs in (
        ("encoder", "model.encoder", [("self_attn", "self_attn", attention),
                                      ("attn_sublayer.norm", "self_attn_layer_norm", None),
                                      ("ffn.w1", "fc1", None), ("ffn.w2", "fc2", None),
                                      ("ffn_sublayer.norm", "final_layer_norm", None)]),
        ("decoder", "model.decoder", [("self_attn", "self_attn", attention),
                                      ("attn_sublayer.norm", "self_attn_layer_norm", None),
                                      ("cross_attn", "encoder_attn", attention),
                                      ("cross_sublayer.norm", "encoder_attn_layer_norm", None),
                                      ("ffn.w1", "fc1", None), ("ffn.w2", "fc2", None),
                                      ("ffn_sublayer.norm", "final_layer_norm", None)]),
    ):
        for ours, theirs, inner in subs:
            for o, t in (inner or [("", "")]):
                for kind in ("weight", "bias"):
                    a = f"{side}.layers.{{i}}.{ours}{'.' + o if o else ''}.{kind}"
                    b = f"{theirs_side}.layers.{{i}}.{theirs}{'.' + t if t else ''}.{kind}"
                    rows.append((a, b, False))
    return rows


register(Family("marian", "MarianMTModel", marian_to_config, marian_from_config,
                marian_weights))
