"""GPT-2, Llama and Mistral as Hugging Face stores them, mapped onto attnlab's GPT.

Llama's ``rope_scaling`` (``rope_parameters`` since transformers 5) is carried over as it is:
linear, dynamic, yarn and llama3 (:mod:`attnlab.nn.rope_scaling`). Mistral is Llama with a
``sliding_window``.
"""

from __future__ import annotations

import math

from attnlab.config import ROPE_SCALING, ModelConfig
from attnlab.errors import BadInput
from attnlab.interop.huggingface import (
    Family,
    activation_from_hf,
    activation_to_hf,
    register,
    require,
)

# transformers' defaults for fields a config.json may leave out (GPT2Config, LlamaConfig)
_GPT2_DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                      activation_function="gelu_new")
_LLAMA_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, hidden_act="silu")
_MISTRAL_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=4096 * 32, sliding_window=4096,
                         hidden_act="silu", rms_norm_eps=1e-6)


def _require(hf: dict, field: str, allowed, what: str):
    value = hf.get(field)
    if value not in allowed:
        raise BadInput(f"{field}={value!r} is not supported for {what} "
                       f"(supported: {sorted(map(str, allowed))})")
    return value


def gpt2_to_config(hf: dict) -> ModelConfig:
    hf = {**_GPT2_DEFAULTS, **hf}
    act = activation_from_hf(hf, "activation_function", "gelu_new", "gpt2")
    d = hf["n_embd"]
    eos = _first(hf.get("eos_token_id", 50256))
    return ModelConfig(
        arch="decoder", vocab_size=hf["vocab_size"], d_model=d, n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d, n_encoder_layers=0, n_decoder_layers=hf["n_layer"],
        dropout=hf.get("resid_pdrop", 0.1), attention_dropout=hf.get("attn_pdrop", 0.1),
        max_len=hf["n_positions"], positional="learned",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), norm_placement="pre",
        activation=act, fused_qkv=True, scale_embeddings=False,
        tie_embeddings=hf.get("tie_word_embeddings", True), pad_id=eos, unk_id=eos,
        bos_id=hf.get("bos_token_id", eos), eos_id=eos, extra={"hf_model_type": "gpt2"},
    )


def gpt2_from_config(c: ModelConfig) -> dict:
    act = activation_to_hf(c, "GPT2LMHeadModel")
    require(c, "GPT2LMHeadModel", positional="learned", norm="layernorm", norm_placement="pre",
            use_final_norm=True, bias=True, fused_qkv=True, kv_heads=c.n_heads, head_dim=None,
            scale_attention=True, scale_embeddings=False, sliding_window=None)
    return dict(vocab_size=c.vocab_size, n_embd=c.d_model, n_head=c.n_heads,
                n_layer=c.n_decoder_layers, n_inner=c.d_ff, n_positions=c.max_len,
                activation_function=act,
                layer_norm_epsilon=c.norm_eps, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
                attn_pdrop=c.attention_dropout, tie_word_embeddings=c.tie_embeddings,
                bos_token_id=c.bos_id, eos_token_id=c.eos_id)


def gpt2_weights(c: ModelConfig):
    b, h = "blocks.layers.{i}", "transformer.h.{i}"
    rows = [("embed.weight", "transformer.wte.weight", False),
            ("positional.weight", "transformer.wpe.weight", False)]
    for ours, theirs, t in [
        ("attn_sublayer.norm.weight", "ln_1.weight", False),
        ("attn_sublayer.norm.bias", "ln_1.bias", False),
        ("self_attn.qkv.weight", "attn.c_attn.weight", True),  # Conv1D: (in, out)
        ("self_attn.qkv.bias", "attn.c_attn.bias", False),
        ("self_attn.out_proj.weight", "attn.c_proj.weight", True),
        ("self_attn.out_proj.bias", "attn.c_proj.bias", False),
        ("ffn_sublayer.norm.weight", "ln_2.weight", False),
        ("ffn_sublayer.norm.bias", "ln_2.bias", False),
        ("ffn.w1.weight", "mlp.c_fc.weight", True), ("ffn.w1.bias", "mlp.c_fc.bias", False),
        ("ffn.w2.weight", "mlp.c_proj.weight", True), ("ffn.w2.bias", "mlp.c_proj.bias", False),
    ]:
        rows.append((f"{b}.{ours}", f"{h}.{theirs}", t))
    rows += [("blocks.norm.weight", "transformer.ln_f.weight", False),
             ("blocks.norm.bias", "transformer.ln_f.bias", False),
             ("lm_head.weight", "lm_head.weight", False)]
    return rows


# the rope_parameters fields each scaling type reads (nn/rope_scaling.py); others are dropped
_ROPE_FIELDS = {
    "linear": ("factor",), "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
               "high_freq_factor"),
}


def rope_from_hf(hf: dict) -> tuple[float, dict, int]:
    """``(rope_base, rope_scaling, max_len)`` from a config.json: transformers 5's
    ``rope_parameters`` or the older ``rope_theta`` + ``rope_scaling`` (``type`` or
    ``rope_type``). Dynamic NTK has no table to outgrow: its context is the trained one times
    the factor, and the trained one is kept as ``original_max_position_embeddings``. YaRN and
    llama3 reach ``factor × original_max_position_embeddings`` (the original defaulting to
    ``max_position_embeddings``, as in transformers), or ``max_position_embeddings`` if that
    is longer: Qwen2.5 keeps the trained 32k there and puts the reach in the factor."""
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    base = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    max_len = hf.get("max_position_embeddings", 2048)
    if kind == "default":
        return base, {}, max_len
    if kind not in ROPE_SCALING:
        raise BadInput(f"rope_type={kind!r} is not supported (supported: default, "
                       f"{', '.join(ROPE_SCALING)})")
    scaling = {k: params[k] for k in _ROPE_FIELDS[kind] if params.get(k) is not None}
    scaling["rope_type"] = kind
    if kind == "yarn" and "factor" not in scaling and "original_max_position_embeddings" in params:
        scaling["factor"] = max_len / params["original_max_position_embeddings"]
    if kind in ("yarn", "llama3"):
        scaling.setdefault("original_max_position_embeddings", max_len)
        max_len = _longest(max_len, scaling)
    if kind == "dynamic":  # transformers' trained length is max_position_embeddings, always
        scaling["original_max_position_embeddings"] = max_len
        max_len = int(max_len * float(scaling.get("factor", 1)))
    return base, scaling, max_len


def _longest(max_len, scaling: dict):
    """The larger of ``max_len`` and ``factor × original_max_position_embeddings``; ``max_len``
    as it is where one is not a positive number (ModelConfig's checks then name it)."""
    numbers = [max_len, scaling.get("factor"), scaling["original_max_position_embeddings"]]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
               for v in numbers) or not isinstance(max_len, int):
        return max_len
    reach = numbers[1] * numbers[2]
    return max(max_len, int(reach)) if math.isfinite(reach) else max_len


def rope_to_hf(c: ModelConfig) -> dict:
    """The inverse of :func:`rope_from_hf`: ``rope_parameters`` and ``max_position_embeddings``."""
    scaling = dict(c.rope_scaling)
    max_len = c.max_len
    if scaling.get("rope_type") == "dynamic":
        max_len = scaling.pop("original_max_position_embeddings")
    return dict(rope_parameters={"rope_type": "default", **scaling, "rope_theta": c.rope_base},
                max_position_embeddings=max_len)


def llama_to_config(hf: dict, model_type: str = "llama") -> ModelConfig:
    hf = {**(_MISTRAL_DEFAULTS if model_type == "mistral" else _LLAMA_DEFAULTS), **hf}
    _require(hf, "hidden_act", ("silu",), model_type)
    rope_base, rope_scaling, max_len = rope_from_hf(hf)
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise BadInput("attention_bias and mlp_bias must agree "
                       f"(got {hf.get('attention_bias')!r} and {hf.get('mlp_bias')!r})")
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise BadInput(f"head_dim={head_dim} with {heads} heads != "
                       f"hidden_size={d} (not supported)")
    return ModelConfig(
        arch="decoder", vocab_size=hf["vocab_size"], d_model=d, n_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, d_ff=hf["intermediate_size"],
        n_encoder_layers=0, n_decoder_layers=hf["num_hidden_layers"], dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0),
        max_len=max_len, positional="rope", rope_base=rope_base, rope_scaling=rope_scaling,
        sliding_window=hf.get("sliding_window") if model_type == "mistral" else None,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), norm_placement="pre", activation="swiglu",
        bias=bool(hf.get("attention_bias", False)), scale_embeddings=False,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        pad_id=hf.get("pad_token_id") or 0, bos_id=hf.get("bos_token_id", 1),
        eos_id=_first(hf.get("eos_token_id", 2)), extra={"hf_model_type": model_type},
    )


def mistral_to_config(hf: dict) -> ModelConfig:
    return llama_to_config(hf, "mistral")


def _first(value):
    """The first of several eos ids (Llama 3 lists its end-of-text and end-of-turn ids)."""
    return value[0] if isinstance(value, list) else value


def llama_from_config(c: ModelConfig) -> dict:
    if c.sliding_window is not None:
        raise BadInput(f"sliding_window={c.sliding_window} has no LlamaForCausalLM equivalent "
                       "(a MistralForCausalLM has one)")
    return _llama_fields(c, "LlamaForCausalLM")


def _llama_fields(c: ModelConfig, cls: str) -> dict:
    require(c, cls, positional="rope", norm="rmsnorm", norm_placement="pre",
            use_final_norm=True, activation="swiglu", fused_qkv=False, scale_attention=True,
            scale_embeddings=False)
    return dict(vocab_size=c.vocab_size, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                num_key_value_heads=c.kv_heads, intermediate_size=c.d_ff,
                num_hidden_layers=c.n_decoder_layers, **rope_to_hf(c),
                rms_norm_eps=c.norm_eps, hidden_act="silu",
                attention_bias=c.bias, mlp_bias=c.bias, tie_word_embeddings=c.tie_embeddings,
                head_dim=c.d_k, bos_token_id=c.bos_id, eos_token_id=c.eos_id,
                pad_token_id=c.pad_id)


def mistral_from_config(c: ModelConfig) -> dict:
    return {**_llama_fields(c, "MistralForCausalLM"), "sliding_window": c.sliding_window}


def llama_weights(c: ModelConfig):
    b, h = "blocks.layers.{i}", "model.layers.{i}"
    pairs = [("attn_sublayer.norm.weight", "input_layernorm.weight"),
             ("self_attn.q_proj.weight", "self_attn.q_proj.weight"),
             ("self_attn.k_proj.weight", "self_attn.k_proj.weight"),
             ("self_attn.v_proj.weight", "self_attn.v_proj.weight"),
             ("self_attn.out_proj.weight", "self_attn.o_proj.weight"),
             ("ffn_sublayer.norm.weight", "post_attention_layernorm.weight"),
             ("ffn.w1.weight", "mlp.gate_proj.weight"), ("ffn.w3.weight", "mlp.up_proj.weight"),
             ("ffn.w2.weight", "mlp.down_proj.weight")]
    if c.bias:
        pairs += [(o.replace("weight", "bias"), t.replace("weight", "bias")) for o, t in pairs
                  if "proj" in o or "ffn.w" in o]
    rows = [("embed.weight", "model.embed_tokens.weight", False)]
    rows += [(f"{b}.{o}", f"{h}.{t}", False) for o, t in pairs]
    rows += [("blocks.norm.weight", "model.norm.weight", False),
             ("lm_head.weight", "lm_head.weight", False)]
    return rows


register(Family("gpt2", "GPT2LMHeadModel", gpt2_to_config, gpt2_from_config, gpt2_weights))
register(Family("llama", "LlamaForCausalLM", llama_to_config, llama_from_config, llama_weights))
register(Family("mistral", "MistralForCausalLM", mistral_to_config, mistral_from_config,
                llama_weights))
