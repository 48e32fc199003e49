"""attnlab models into GGUF files (llama.cpp's format): the inverse of :mod:`.gguf`.

A Llama-architecture :class:`~attnlab.models.GPT` (RoPE, RMSNorm, SwiGLU, no biases; grouped
key/value heads, linear RoPE scaling) and its byte-level BPE tokenizer are written with the
``gguf`` package's writer, as llama.cpp's own converter lays them out:

* metadata ``llama.*`` (widths, heads, layers, context, RoPE base and scaling, RMSNorm ε) and
  ``tokenizer.ggml.*`` (the token list, the merges, the special ids);
* tensors named ``token_embd``, ``blk.N.attn_q`` … ``output``, each ``(out, in)`` matrix in the
  chosen type and the norms' gains in f32; the rows of W_Q and W_K go from the rotate-half
  RoPE layout (pairs i, i + d/2) to llama.cpp's interleaved one (pairs 2i, 2i + 1).

Types: ``f32`` (exact), ``f16``, ``q8_0`` (blocks of 32: one f16 scale s = max|w|/127 and 32
int8 codes; |w − ŵ| ≤ s/2) and ``q4_1`` (blocks of 32: an f16 scale s = (max − min)/15, an f16
minimum and 32 4-bit codes; |w − ŵ| ≤ s/2, plus the f16 rounding of s and min). A matrix whose
rows do not split into blocks of 32 stays f16. The file is written beside its name and renamed
into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from attnlab.errors import BadInput, MissingDependency, WriteFailed
from attnlab.interop.gguf import _LAYER

TYPES = ("f32", "f16", "q8_0", "q4_1")
_GGUF_NAME = {ours: theirs for theirs, ours in _LAYER.items()}


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rotate-half RoPE rows -> llama.cpp's interleaved rows, per head (the inverse of
    :func:`attnlab.interop.gguf._unpermute`)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _check_exportable(model, tokenizer) -> None:
    from attnlab.models import GPT
    from attnlab.tokenizers.bpe import BPETokenizer

    c = getattr(model, "config", None)
    wanted = {"positional": "rope", "norm": "rmsnorm", "activation": "swiglu",
              "norm_placement": "pre"}
    if not isinstance(model, GPT) or c is None:
        raise BadInput("GGUF export writes decoder-only (GPT-family) models")
    off = [f"{k}={getattr(c, k)!r}" for k, v in wanted.items() if getattr(c, k) != v]
    off += ["biases"] if c.bias else []
    off += [f"sliding_window={c.sliding_window}"] if c.sliding_window is not None else []
    off += ["pruned heads"] if c.pruned_heads else []
    kind = (c.rope_scaling or {}).get("rope_type")
    off += [f"rope_scaling {kind!r}"] if kind not in (None, "linear") else []
    if off:
        raise BadInput("GGUF export writes Llama-architecture models (RoPE, RMSNorm, SwiGLU, "
                       f"pre-norm, no biases); this one has {', '.join(off)}")
    if not isinstance(tokenizer, BPETokenizer):
        raise BadInput(f"GGUF export needs a byte-level BPE tokenizer (llama.cpp's 'gpt2' "
                       f"model), not a {type(tokenizer).__name__}")


def _vocab_and_merges(tokenizer) -> tuple[list[str], list[str], bool, set[int]]:
    """The token list (by id), the ``"a b"`` merges, whether digits are split one by one
    (SmolLM's pre-tokenizer) and the ids of the special tokens, of a byte-level BPE
    tokenizer."""
    data = json.loads(tokenizer.backend.to_str())
    vocab = dict(data["model"]["vocab"])
    special = set()
    for added in data.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        if added.get("special", False):
            special.add(added["id"])
    tokens = [None] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    if any(t is None for t in tokens):
        raise BadInput("the tokenizer's ids have gaps: GGUF's token list cannot hold them")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    pre = json.dumps(data.get("pre_tokenizer"))
    return tokens, merges, '"Digits"' in pre, special


def save_gguf(model, tokenizer, path: str | os.PathLike, type: str = "f32",
              chat_template: str | None = None) -> Path:
    """Write ``model`` (a Llama-architecture GPT) and ``tokenizer`` to the GGUF file ``path``
    with its matrices in ``type`` (``f32``, ``f16``, ``q8_0`` or ``q4_1``), and the
    ``chat_template`` (Jinja text) when there is one; returns the path.
    :func:`attnlab.interop.gguf.load_gguf` (and llama.cpp) read it back. The tokenizer's
    special tokens are typed CONTROL, so that llama.cpp parses ``<|im_start|>`` in a prompt as
    one token, as attnlab does."""
    try:
        import gguf
    except ImportError:
        raise MissingDependency("writing GGUF needs the 'gguf' package (pip install "
                                "'attnlab[gguf]')") from None
    if type not in TYPES:
        raise BadInput(f"--type {type!r}: expected one of {', '.join(TYPES)}")
    _check_exportable(model, tokenizer)
    c, path = model.config, Path(path)
    tokens, merges, digits, special = _vocab_and_merges(tokenizer)
    if len(tokens) > c.vocab_size:
        raise BadInput(f"the tokenizer has {len(tokens)} tokens for a model of {c.vocab_size}")
    kinds = gguf.TokenType
    types = [kinds.CONTROL if i in special else kinds.NORMAL for i in range(len(tokens))]
    types += [kinds.UNUSED] * (c.vocab_size - len(tokens))
    tokens += [f"<unused{i}>" for i in range(len(tokens), c.vocab_size)]
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = gguf.GGUFWriter(str(tmp), "llama")
        _metadata(writer, gguf, c, type)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm" if digits else "default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_add_bos_token(False)  # as attnlab encodes: a prompt starts as written
        if chat_template is not None:
            writer.add_chat_template(chat_template)
        for name, value in (("bos", c.bos_id), ("eos", c.eos_id), ("pad", c.pad_id),
                            ("unk", c.unk_id)):
            if value is not None:
                getattr(writer, f"add_{name}_token_id")(int(value))
        for name, w in _tensors(model):
            data, qtype = _encode(gguf, w, type)
            writer.add_tensor(name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WriteFailed(f"{path}: could not be written ({e.strerror or e})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _metadata(writer, gguf, c, type: str) -> None:
    writer.add_name("attnlab export")
    writer.add_context_length(c.max_len)
    writer.add_embedding_length(c.d_model)
    writer.add_block_count(c.n_decoder_layers)
    writer.add_feed_forward_length(c.d_ff)
    writer.add_head_count(c.n_heads)
    writer.add_head_count_kv(c.kv_heads)
    writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_rope_freq_base(c.rope_base)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[type])
    if (c.rope_scaling or {}).get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(c.rope_scaling["factor"]))


def _tensors(model):
    """``(gguf name, float32 tensor)`` in llama.cpp's order and layout."""
    c = model.config
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    yield "token_embd.weight", state["embed.weight"]
    for i in range(c.n_decoder_layers):
        for ours, theirs in _GGUF_NAME.items():
            w = state[f"blocks.layers.{i}.{ours}"]
            if theirs == "attn_q":
                w = _permute(w, c.n_heads)
            elif theirs == "attn_k":
                w = _permute(w, c.kv_heads)
            yield f"blk.{i}.{theirs}.weight", w
    yield "output_norm.weight", state["blocks.norm.weight"]
    if not c.tie_embeddings:
        yield "output.weight", state["lm_head.weight"]


def _encode(gguf, w: torch.Tensor, type: str) -> tuple:
    """``(data, raw_dtype)`` for :meth:`GGUFWriter.add_tensor`: 1-D tensors (norm gains) in
    f32, matrices in ``type`` (f16 where their rows do not split into blocks of 32)."""
    data = np.ascontiguousarray(w.numpy(), dtype=np.float32)
    if data.ndim == 1 or type == "f32":
        return data, None
    if type == "f16" or data.shape[-1] % 32:
        return data.astype(np.float16), None
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_1": gguf.GGMLQuantizationType.Q4_1}[type]
    return gguf.quants.quantize(data, qtype), qtype


__all__ = ["TYPES", "save_gguf"]
