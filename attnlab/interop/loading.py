"""One entry point for "a model to generate with": an attnlab run or checkpoint folder, a
Hugging Face folder (config.json + model.safetensors + tokenizer.json) or a GGUF file."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def load_for_generation(path: str | os.PathLike, int4: bool = False, device=None,
                        precision: str = "fp32"):
    """``(model, tokenizer)`` in eval mode on ``device`` (default CPU), its weights in
    ``precision`` (fp32, bf16 or fp16: decoding reads every weight once per token, so half
    the bytes is what makes it faster); ``int4`` gives 4-bit weight matrices with bf16
    activations (a GGUF file's own Q4_1 codes, or else the float weights quantised), which
    run on the CPU only."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model not found: {path}")
    from attnlab.generation import decoding_layout_

    if path.suffix == ".gguf":
        from attnlab.interop.gguf import load_gguf

        model, tok = load_gguf(path, quantized=int4)
    else:
        model, tok = _load_float(path)
        if int4:
            from attnlab.nn.quantized import quantize_int4

            model = quantize_int4(model)
    if int4:
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"--int4 runs on the CPU only, not on {device}")
    else:
        from attnlab.hardware import DTYPES

        model = model.to(device=device, dtype=DTYPES[precision])
    return decoding_layout_(model), tok  # fp32 matrices input-major: faster decoding


def _load_float(path: Path):
    from attnlab.interop.huggingface import read_hf_config

    config = path / "config.json"
    if config.exists() and "model_type" in read_hf_config(path):
        from tokenizers import Tokenizer as HFTokenizer

        from attnlab.interop.huggingface import from_pretrained
        from attnlab.tokenizers.bpe import BPETokenizer

        model = from_pretrained(path)
        if not (path / "tokenizer.json").exists():
            raise FileNotFoundError(f"{path / 'tokenizer.json'}: not found (needed to encode "
                                    "the prompt)")
        c = model.config
        tok = BPETokenizer(HFTokenizer.from_file(str(path / "tokenizer.json")), c.bos_id,
                           c.eos_id, c.pad_id, c.unk_id)
        return model, tok
    from attnlab.training.checkpoint import load_model_dir

    model, _, tokenizers = load_model_dir(path)
    if "text" not in tokenizers:
        raise ValueError(f"{path}: not a language model (its tokenizers are "
                         f"{sorted(tokenizers)}); use 'attnlab translate' for translators")
    return model, tokenizers["text"]
