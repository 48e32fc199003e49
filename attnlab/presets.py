"""The published models' choices of :class:`attnlab.config.ModelConfig`'s knobs, by name.

``ModelConfig.from_preset(name, **overrides)`` reads them; a field a preset leaves out keeps
the config's default (the paper's base model, an encoder–decoder). Each family is one set of
knob values, never a model of its own.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The paper, Table 3: 6 + 6 layers, post-LN, ReLU, sinusoidal, shared tied embeddings.
    "base": {},
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3),
    # Sized for a 2-core CPU: minutes, not days.
    "small": dict(
        vocab_size=8000, d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3,
        n_decoder_layers=3, max_len=512,
    ),
    "tiny": dict(
        vocab_size=1000, d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2,
        n_decoder_layers=2, max_len=256,
    ),
}

# Decoder-only families (attnlab.models.GPT): the encoder layer run causally, pre-LN.
_GPT2 = dict(
    arch="decoder", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_encoder_layers=0,
    n_decoder_layers=12, dropout=0.1, max_len=1024, positional="learned", norm_eps=1e-5,
    norm_placement="pre", activation="gelu_tanh", fused_qkv=True, scale_embeddings=False,
    pad_id=50256, unk_id=50256, bos_id=50256, eos_id=50256,
)
_LLAMA = dict(  # the shape of SmolLM2-135M, a Llama-architecture model
    arch="decoder", vocab_size=49152, d_model=576, n_heads=9, num_kv_heads=3, d_ff=1536,
    n_encoder_layers=0, n_decoder_layers=30, dropout=0.0, max_len=8192, positional="rope",
    rope_base=100000.0, norm="rmsnorm", norm_eps=1e-5, norm_placement="pre",
    activation="swiglu", bias=False, scale_embeddings=False, pad_id=2, unk_id=0, bos_id=1,
    eos_id=2,
)
PRESETS.update({
    "gpt2": _GPT2,
    "gpt-mini": {**_GPT2, "vocab_size": 256, "d_model": 128, "n_heads": 4, "d_ff": 512,
                 "n_decoder_layers": 4, "max_len": 256, "dropout": 0.0},
    "llama": _LLAMA,
    "llama-mini": {**_LLAMA, "vocab_size": 256, "d_model": 128, "n_heads": 4, "num_kv_heads": 2,
                   "d_ff": 344, "n_decoder_layers": 4, "max_len": 256, "rope_base": 10000.0},
})

# Encoder-only (attnlab.models.BERT): post-LN, exact GELU, learned positions, segment embeddings
# and a LayerNorm on their sum, ε = 1e-12; ids of the uncased WordPiece vocabulary.
_BERT = dict(
    arch="encoder", vocab_size=30522, d_model=768, n_heads=12, d_ff=3072, n_encoder_layers=12,
    n_decoder_layers=0, dropout=0.1, attention_dropout=0.1, max_len=512, positional="learned",
    norm_eps=1e-12, norm_placement="post", activation="gelu", scale_embeddings=False,
    type_vocab_size=2, embedding_norm=True, pad_id=0, unk_id=100, bos_id=101, eos_id=102,
)
PRESETS.update({
    "bert-base": _BERT,
    "bert-large": {**_BERT, "d_model": 1024, "n_heads": 16, "d_ff": 4096, "n_encoder_layers": 24},
    # Google's compact BERTs (Turc et al., 2019): BERT-mini is L=4, H=256; BERT-tiny L=2, H=128.
    "bert-mini": {**_BERT, "d_model": 256, "n_heads": 4, "d_ff": 1024, "n_encoder_layers": 4},
    "bert-tiny": {**_BERT, "d_model": 128, "n_heads": 2, "d_ff": 512, "n_encoder_layers": 2},
})

# Vision Transformer (attnlab.models.ViT, Dosovitskiy et al., 2021): the encoder, pre-LN, exact
# GELU, a final norm, learned positions for [CLS] + the patches, ε = 1e-12 (as in transformers).
_VIT = dict(
    arch="vision", d_model=768, n_heads=12, d_ff=3072, n_encoder_layers=12, n_decoder_layers=0,
    dropout=0.0, attention_dropout=0.0, max_len=197, positional="learned", norm_eps=1e-12,
    norm_placement="pre", activation="gelu", scale_embeddings=False, head="classify",
    num_labels=1000, image_size=224, patch_size=16, num_channels=3,
)
PRESETS.update({
    "vit-base": _VIT,  # ViT-B/16 (the paper, Table 1), 224 × 224 RGB, ImageNet's 1000 classes
    # 8 × 8 grayscale digits (sklearn's digits): 16 patches of 2 × 2 pixels, 10 classes
    "vit-tiny": {**_VIT, "d_model": 64, "n_heads": 4, "d_ff": 128, "n_encoder_layers": 4,
                 "max_len": 17, "dropout": 0.1, "num_labels": 10, "image_size": 8,
                 "patch_size": 2, "num_channels": 1},
})

# Mistral (Jiang et al., 2023): Llama with sliding-window attention, untied; Mistral-7B-v0.1,
# and "mistral-tiny", a small model of its proportions (4 layers, a window of 256 positions)
_MISTRAL = {**_LLAMA, "vocab_size": 32000, "d_model": 4096, "n_heads": 32, "num_kv_heads": 8,
            "d_ff": 14336, "n_decoder_layers": 32, "max_len": 32768, "rope_base": 10000.0,
            "sliding_window": 4096, "tie_embeddings": False, "pad_id": 0, "unk_id": 0,
            "bos_id": 1, "eos_id": 2}
PRESETS.update({
    "mistral-7b": _MISTRAL,
    "mistral-tiny": {**_MISTRAL, "d_model": 256, "n_heads": 4, "num_kv_heads": 2, "d_ff": 896,
                     "n_decoder_layers": 4, "max_len": 1024, "sliding_window": 256},
})

# BERT's descendants, as configurations of the same model (attnlab.models.BERT):
# RoBERTa (Liu et al., 2019): byte-level BPE ids, positions counted from pad_id + 1 (so 514
# rows for 512 tokens), a one-row token-type table; ALBERT (Lan et al., 2020), albert-base-v2:
# embeddings 128 wide lifted to 768, one layer shared by all 12, GELU's tanh form, no dropout;
# DistilBERT (Sanh et al., 2019): 6 layers, no token types, no pooler; ELECTRA (Clark et al.,
# 2020), the small discriminator: embeddings 128 wide projected to 256, no pooler.
PRESETS.update({
    "roberta-base": {**_BERT, "vocab_size": 50265, "max_len": 514, "type_vocab_size": 1,
                     "norm_eps": 1e-5, "position_offset": 2, "pad_id": 1, "unk_id": 3,
                     "bos_id": 0, "eos_id": 2},
    "albert-base": {**_BERT, "vocab_size": 30000, "embedding_size": 128, "share_layers": True,
                    "activation": "gelu_tanh", "dropout": 0.0, "attention_dropout": 0.0,
                    "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3},
    "distilbert-base": {**_BERT, "n_encoder_layers": 6, "type_vocab_size": 0, "pooler": False},
    "electra-small": {**_BERT, "embedding_size": 128, "d_model": 256, "n_heads": 4,
                      "d_ff": 1024, "pooler": False},
})

# Longformer (Beltagy et al., 2020), longformer-base-4096: RoBERTa over 4,096 positions whose
# layers attend a band of 512 tokens (256 each side) and the global tokens (attnlab.nn.longformer)
PRESETS["longformer-base"] = {**PRESETS["roberta-base"], "max_len": 4098,
                              "attention_window": 512}

# T5 (Raffel et al., 2020; attnlab.models.Transformer): pre-LN RMSNorm with a final norm, no
# biases, no √d scale on the embeddings or 1/√d_k on the scores, a learned relative position
# bias per stack, ReLU and a tied head scaled by d^-½ (v1.0); the shape of transformers'
# T5Config() defaults, i.e. t5-small. Decoding starts from the pad id 0 and ends at eos 1.
_T5 = dict(
    arch="encoder-decoder", vocab_size=32128, d_model=512, n_heads=8, head_dim=64, d_ff=2048,
    n_encoder_layers=6, n_decoder_layers=6, dropout=0.1, attention_dropout=0.1,
    activation_dropout=0.1, max_len=512, positional="relative", relative_buckets=32,
    relative_max_distance=128, scale_attention=False, norm="rmsnorm", norm_eps=1e-6,
    norm_placement="pre", final_norm=True, activation="relu", bias=False,
    scale_embeddings=False, tie_embeddings=True, scale_tied_logits=True, pad_id=0, unk_id=2,
    bos_id=0, eos_id=1,
)
PRESETS.update({
    "t5-small": _T5,
})
