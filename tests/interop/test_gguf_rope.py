"""RoPE scaling read from GGUF files: llama.cpp's metadata, and the frequency divisors its
converter stores for Llama 3.1/3.2 (rope_freqs.weight), against transformers' llama3 formula."""

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
transformers = pytest.importorskip("transformers")


def write_metadata_only_gguf(path, divisors=None, scaling_type=None):
    """A Llama GGUF file with the metadata attnlab reads and, if given, llama.cpp's
    ``rope_freqs.weight`` (no weights: only its config is read)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_uint32("llama.feed_forward_length", 128)
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.context_length", 1024)
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    if scaling_type is not None:
        w.add_string("llama.rope.scaling.type", scaling_type)
        w.add_float32("llama.rope.scaling.factor", 4.0)
    if divisors is not None:
        w.add_tensor("rope_freqs.weight", divisors.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama3_divisors(factor=8.0):
    """θ_i over transformers' llama3-scaled θ_i: what llama.cpp's converter stores."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
    plain = 1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return (plain / scaled.double()).numpy()


def test_llama3_rope_freqs_become_its_rope_scaling(tmp_path):
    from attnlab.interop.gguf import _reader, gguf_config

    path = write_metadata_only_gguf(tmp_path / "l3.gguf", llama3_divisors())
    config = gguf_config(_reader(path)[1], path)
    assert config.rope_scaling == {"rope_type": "llama3", "factor": 8.0,
                                   "original_max_position_embeddings": 8192,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def test_linear_scaling_metadata_and_unknown_divisors(tmp_path):
    from attnlab.interop.gguf import _reader, gguf_config

    path = write_metadata_only_gguf(tmp_path / "lin.gguf", scaling_type="linear")
    assert gguf_config(_reader(path)[1], path).rope_scaling == {"rope_type": "linear",
                                                                "factor": 4.0}
    odd = llama3_divisors()
    odd[3] *= 1.5  # not a llama3 smoothing any more
    path = write_metadata_only_gguf(tmp_path / "odd.gguf", odd)
    with pytest.raises(ValueError, match="rope_freqs.weight holds frequency divisors that are "
                                         "not llama3's"):
        gguf_config(_reader(path)[1], path)


def test_rope_freqs_of_the_wrong_length_is_one_line(tmp_path):
    from attnlab.interop.gguf import _reader, gguf_config

    path = write_metadata_only_gguf(tmp_path / "short.gguf", llama3_divisors()[:3])
    with pytest.raises(ValueError, match="rope_freqs.weight holds 3 values for 8 rotated pairs"):
        gguf_config(_reader(path)[1], path)
