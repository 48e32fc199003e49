"""The fixtures of the fuzz tests: the valid files they damage. (The memory bound is measured
around each example, in ``holds``: tests/fuzz/fuzzing.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from attnlab import ModelConfig, build_model, save_pretrained
from tests.fuzz.fuzzing import TEXTS, TINY_GPT, Files, write_tiny_gguf


@pytest.fixture(scope="session")
def valid(tmp_path_factory) -> Files:
    """Every valid file the tests mutate, by name."""
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer

    root = tmp_path_factory.mktemp("valid")
    files = Files()

    char = CharTokenizer.train(TEXTS)
    char.save(root / "char.json")
    files["char.json"] = (root / "char.json").read_bytes()
    BPETokenizer.train(TEXTS * 20, vocab_size=300).save_hf(root / "tokenizer.json")
    files["tokenizer.json"] = (root / "tokenizer.json").read_bytes()
    files["vocab.txt"] = ("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",
                                     "quick", "brown", "##s", "fox", ",", "."]) + "\n").encode()
    files["tokenizer_config.json"] = json.dumps({"do_lower_case": False,
                                                 "model_max_length": 512}).encode()
    wordpiece = WordPieceTokenizer.from_vocab(files["vocab.txt"].decode().splitlines())
    wordpiece.backend.save(str(root / "wordpiece.json"))
    files["wordpiece/tokenizer.json"] = (root / "wordpiece.json").read_bytes()

    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt-mini", **TINY_GPT)
    model = build_model(config)

    def saved(model, ours: str, hf: str) -> None:  # an attnlab folder and an HF folder, read
        save_model_dir(root / ours, model, model.config, {"text": char.to_dict()})
        save_pretrained(model, root / hf)
        for folder, names in ((ours, ("model.safetensors", "config.json", "tokenizers.json")),
                              (hf, ("model.safetensors", "config.json"))):
            for name in names:
                files[f"{folder}/{name}"] = (root / folder / name).read_bytes()

    saved(model, "model", "hf")
    shard = "model-00001-of-00001.safetensors"  # the same weights as a sharded folder's
    names = load_file(root / "hf" / "model.safetensors")
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {name: shard for name in names}}).encode()
    # Llama-style (RoPE) models, for the known cases below
    llama = build_model(ModelConfig.from_preset("llama-mini", **TINY_GPT, num_kv_heads=2))
    saved(llama, "llama", "hf-llama")
    files["config.json"] = files["model/config.json"]

    optimizer = {"state": {0: {"exp_avg": torch.randn(4, 4), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    torch.save({"step": 12, "epoch": 1, "lr": [0.1, 0.01], "rng": torch.get_rng_state()[:64],
                "optimizer": optimizer, "position": [3, 1, 4]}, root / "trainer_state.pt")
    files["trainer_state.pt"] = (root / "trainer_state.pt").read_bytes()

    rows = [{"id": str(i), "text": t, "label": "pos" if i % 2 else "neg"}
            for i, t in enumerate(TEXTS)]
    files["data.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    files["src.txt"] = "".join(t + "\n" for t in TEXTS).encode()
    files["tgt.txt"] = "".join(t.upper() + "\n" for t in TEXTS).encode()
    return files


@pytest.fixture(scope="session")
def valid_gguf(tmp_path_factory) -> Files:
    """The tiny GGUF file's bytes, and where its tensor data starts (``data_offset``)."""
    pytest.importorskip("gguf")
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    files = Files({"tiny.gguf": path.read_bytes()})
    files.data_offset = gguf.GGUFReader(str(path)).data_offset
    return files
