"""GGUF files (llama.cpp) into attnlab: Llama-architecture weights, dequantised, and the
tokenizer stored in the file's metadata. Needs the ``gguf`` package.

With ``quantized=True`` the Q4_1 matrices keep their 4-bit codes and run in
:class:`attnlab.nn.quantized.Int4Linear`: the numbers the file holds (up to the bf16
rounding of each group's scale and zero), a seventh of the bytes to read per generated token.

llama.cpp's converter reorders the rows of W_Q and W_K from the "rotate half" RoPE layout
(pairs i, i + d/2; Hugging Face, attnlab) to interleaved pairs (2i, 2i + 1); loading undoes it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.errors import BadInput, MissingDependency, MissingFile
from attnlab.interop.gguf_read import GGUFFile
from attnlab.models import GPT
from attnlab.nn.rope_scaling import base_frequencies, scaled_frequencies

_LAYER = {
    "attn_norm": "attn_sublayer.norm.weight", "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight", "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.out_proj.weight", "ffn_norm": "ffn_sublayer.norm.weight",
    "ffn_gate": "ffn.w1.weight", "ffn_up": "ffn.w3.weight", "ffn_down": "ffn.w2.weight",
}


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise MissingDependency(f"{path}: reading GGUF needs the 'gguf' package "
                                "(pip install 'attnlab[gguf]')") from None
    if not path.exists():
        raise MissingFile(f"GGUF file not found: {path}")
    return gguf, GGUFFile(path)


def _field(reader: GGUFFile, key: str, default=None):
    """A metadata value; an array of numbers as a list (the reader keeps it a view until read)."""
    value = reader.metadata.get(key, default)
    return value.tolist() if isinstance(value, np.ndarray) else value


def metadata_string(path: str | os.PathLike, key: str) -> str | None:
    """One string of a GGUF file's metadata (``tokenizer.chat_template``), or None when the
    file has none."""
    value = _field(_reader(Path(path))[1], key)
    if value is not None and not isinstance(value, str):
        raise BadInput(f"{path}: metadata {key} is not a string")
    return value


def _decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that float32 rounds to it: GGUF holds
    ε = 1e-5 as 9.99999974e-06, which was 1e-5 in the model's own config."""
    return float(str(np.float32(value)))


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Interleaved RoPE rows (llama.cpp) -> rotate-half rows, per head."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _read_config(reader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise BadInput(f"{path}: general.architecture={arch!r} is not supported (only 'llama')")
    p = "llama."
    d = int(_field(reader, p + "embedding_length"))
    heads = int(_field(reader, p + "attention.head_count"))
    base = _decimal(_field(reader, p + "rope.freq_base", 10000.0))
    tokens = _field(reader, "tokenizer.ggml.tokens", [])
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        arch="decoder", vocab_size=int(_field(reader, p + "vocab_size", len(tokens))),
        d_model=d, n_heads=heads,
        num_kv_heads=int(_field(reader, p + "attention.head_count_kv")),
        d_ff=int(_field(reader, p + "feed_forward_length")), n_encoder_layers=0,
        n_decoder_layers=int(_field(reader, p + "block_count")), dropout=0.0,
        max_len=int(_field(reader, p + "context_length")), positional="rope",
        rope_base=base, rope_scaling=_rope_scaling(reader, p, d // max(heads, 1), base, path),
        norm="rmsnorm",
        norm_eps=_decimal(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        norm_placement="pre", activation="swiglu", bias=False, scale_embeddings=False,
        tie_embeddings="output.weight" not in names,
        pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        unk_id=int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)),
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        extra={"hf_model_type": "llama"},
    )


def gguf_config(reader, path: Path) -> ModelConfig:
    """The model config from the file's metadata; missing or malformed fields are named."""
    try:
        return _read_config(reader, path)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        if isinstance(e, BadInput):
            raise
        raise BadInput(f"{path}: missing or malformed metadata ({type(e).__name__}: {e})") from None


def _rope_scaling(reader, p: str, d_k: int, base: float, path: Path) -> dict:
    """``rope_scaling`` from the file: llama.cpp's ``rope.scaling.*`` metadata (linear), or the
    per-pair divisors of θ_i that its converter stores for Llama 3.1 and 3.2
    (``rope_freqs.weight``), recognised as transformers' llama3 scaling with the published
    low/high frequency factors 1 and 4."""
    kind = _field(reader, p + "rope.scaling.type", "none")
    original = int(_field(reader, p + "rope.scaling.original_context_length", 8192))
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        divisors = torch.from_numpy(np.array(freqs.data, dtype=np.float64).reshape(-1))
        if divisors.numel() != d_k // 2:
            raise BadInput(f"{path}: rope_freqs.weight holds {divisors.numel()} values for "
                           f"{d_k // 2} rotated pairs")
        scaling = {"rope_type": "llama3", "factor": float(divisors.max()),
                   "original_max_position_embeddings": original, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0}
        theta = base_frequencies(d_k, base)
        if not torch.allclose(
                theta / scaled_frequencies(d_k, base, scaling)[0], divisors, rtol=1e-3):
            raise BadInput(f"{path}: rope_freqs.weight holds frequency divisors that are not "
                           "llama3's (factor = their largest, low 1, high 4, original "
                           f"{original}): not supported")
        return scaling
    if kind == "linear":
        return {"rope_type": "linear",
                "factor": _decimal(_field(reader, p + "rope.scaling.factor"))}
    if kind != "none":
        raise BadInput(f"{path}: rope.scaling.type={kind!r} is not supported (none, linear, "
                       "or Llama 3's rope_freqs.weight)")
    return {}


# tensors llama.cpp writes that the loaded model computes itself: Llama 3's RoPE frequency
# divisors (read into config.rope_scaling above)
IGNORED = {"rope_freqs.weight"}


def our_name(name: str) -> str:
    """The attnlab parameter a GGUF tensor holds."""
    fixed = {"token_embd.weight": "embed.weight", "output_norm.weight": "blocks.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
        return f"blocks.layers.{parts[1]}.{_LAYER[parts[2]]}"
    raise BadInput(f"tensor {name!r} is not part of a Llama model")


def check_tensors(reader, config: ModelConfig, path: Path) -> None:
    """Every tensor's shape (from its info, not its data) against the model the metadata
    describes, after :func:`attnlab.build.checked_skeleton`'s checks of its sizes."""
    from attnlab import build

    # 1.56 bits a weight is the smallest of llama.cpp's types (IQ1_S): 0.15 bytes bounds them all
    skeleton = build.checked_skeleton(config, path, path.stat().st_size, min_bytes=0.15)
    found = {}
    for t in reader.tensors:
        if t.name in IGNORED:
            continue
        try:
            found[our_name(t.name)] = tuple(int(d) for d in reversed(t.shape))
        except BadInput as e:
            raise BadInput(f"{path}: {e}") from None
    build.check_shapes(build.expected_shapes(skeleton), found, path)


def q4_1_codes(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw Q4_1 rows ``(out, in / 32 · 20 bytes)`` -> ``codes (out, in)``, ``scale`` and
    ``minimum (out, in / 32)``, with ``W = scale · codes + minimum`` per block of 32.

    A block is 20 bytes: the scale and the minimum as float16, then 16 bytes whose low
    nibbles are elements 0–15 and whose high nibbles are elements 16–31."""
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, 20)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    minimum = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    packed = blocks[..., 4:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)
    return (torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(scale.astype(np.float32)),
            torch.from_numpy(minimum.astype(np.float32)))


def dequantize(gguf, t) -> torch.Tensor:
    """A tensor's float32 values, in the ``gguf`` package's shape (``(out, in)`` for a matrix):
    Q4_1 and Q8_0 matrices (SmolLM2's) decoded here in whole-array steps, the same numbers as
    the package's ``dequantize``, which loops over the blocks in Python; anything else by it.
    Q8_0's block is 34 bytes, a float16 scale then 32 int8 codes: ``W = scale · code``."""
    kind = t.tensor_type
    if kind == gguf.GGMLQuantizationType.Q4_1 and t.data.ndim == 2:
        codes, scale, minimum = q4_1_codes(t.data)
        rows, cols = codes.shape
        return (codes.float().view(rows, -1, 32) * scale[..., None]
                + minimum[..., None]).view(rows, cols)
    if kind == gguf.GGMLQuantizationType.Q8_0 and t.data.ndim == 2:
        blocks = t.data.reshape(t.data.shape[0], -1, 34)
        scale = torch.from_numpy(blocks[..., :2].copy().view(np.float16)).float()
        codes = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).float()
        return (codes * scale).view(t.data.shape[0], -1)
    return torch.from_numpy(np.array(gguf.quants.dequantize(t.data, kind), dtype=np.float32))


def load_gguf(path: str | os.PathLike, quantized: bool = False):
    """``(model, tokenizer)`` from a Llama GGUF file: weights dequantised to float32, or with
    ``quantized`` the Q4_1 matrices kept as 4-bit :class:`Int4Linear` layers and the rest in
    ``float_dtype()``, bfloat16 where the CPU runs it natively (a file without Q4_1 matrices
    has its weights quantised by ``quantize``)."""
    path = Path(path)
    gguf, reader = _reader(path)
    config = gguf_config(reader, path)
    check_tensors(reader, config, path)
    state, int4 = {}, {}
    for t in reader.tensors:
        if (quantized and t.tensor_type == gguf.GGMLQuantizationType.Q4_1
                and t.name.startswith("blk.")):  # (a Q4_1 embedding is dequantised)
            _, i, kind, _ = t.name.split(".")
            parts = q4_1_codes(t.data)
            heads = {"attn_q": config.n_heads, "attn_k": config.kv_heads}.get(kind)
            if heads:
                parts = tuple(_unpermute(p, heads) for p in parts)
            int4[f"blocks.layers.{i}.{_LAYER[kind]}"] = parts
            continue
        w = dequantize(gguf, t)
        if t.name == "token_embd.weight":
            state["embed.weight"] = w
        elif t.name == "output_norm.weight":
            state["blocks.norm.weight"] = w
        elif t.name == "output.weight":
            state["lm_head.weight"] = w
        elif t.name.startswith("blk."):
            _, i, kind, _ = t.name.split(".")
            if kind == "attn_q":
                w = _unpermute(w, config.n_heads)
            elif kind == "attn_k":
                w = _unpermute(w, config.kv_heads)
            state[f"blocks.layers.{i}.{_LAYER[kind]}"] = w
    # every weight comes from the file: no random initialisation (of 135M numbers, for
    # SmolLM2) of a model about to be overwritten
    from attnlab import build

    model = build.materialize(build.skeleton(config))
    if int4:
        model = _with_int4(model, int4)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_embeddings)
               and not m.endswith((".qweight", ".scales", ".zeros"))]  # Int4Linear's, set
    if missing or unexpected:
        raise BadInput(f"{path}: tensors do not fit a Llama model (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    if quantized and not int4:  # no Q4_1 matrices in the file: quantise its float weights
        from attnlab.nn.quantized import quantize

        quantize(model, bits=4)
    return model.eval(), gguf_tokenizer(reader, config, path)


def gguf_tokenizer(reader, config: ModelConfig, path: Path):
    """The byte-level BPE tokenizer of the file's metadata; a missing or malformed one is
    named."""
    from attnlab.tokenizers.bpe import BPETokenizer

    # (strings that are not UTF-8 were refused when the file was read)
    lists = [_field(reader, f"tokenizer.ggml.{name}") for name in ("tokens", "merges")]
    pre = _field(reader, "tokenizer.ggml.pre")
    if not all(isinstance(x, list) and all(isinstance(t, str) for t in x) for x in lists):
        raise BadInput(f"{path}: tokenizer.ggml.tokens and tokenizer.ggml.merges must be lists "
                       "of strings (only byte-level BPE tokenizers are read)")
    try:
        return BPETokenizer.from_vocab_and_merges(
            *lists, digits=pre == "smollm",
            bos_id=config.bos_id, eos_id=config.eos_id, pad_id=config.pad_id,
            unk_id=config.unk_id)
    except Exception as e:  # the tokenizers library raises a bare Exception (a bad merge)
        raise BadInput(f"{path}: the tokenizer in the metadata cannot be built ({e})") from None


def _with_int4(model: GPT, layers: dict[str, tuple]) -> GPT:
    """Swap the named ``...weight`` linears for :class:`Int4Linear` built from their codes."""
    from attnlab.nn.quantized import Int4Linear, float_dtype

    model = model.to(float_dtype())
    for name, (codes, scale, minimum) in layers.items():
        parent_name, child = name.removesuffix(".weight").rsplit(".", 1)
        setattr(model.get_submodule(parent_name), child,
                Int4Linear.from_codes(codes, scale, minimum))
    return model
