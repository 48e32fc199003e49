"""Running what ``attnlab export onnx`` wrote, on onnxruntime: an encoder's forward pass, and
greedy decoding with the exported KV cache (:mod:`attnlab.interop.onnx_export` describes the
graphs).

    load_onnx(folder) -> OnnxEncoder | OnnxDecoder | OnnxTranslator   (by export.json's kind)

The decoding loops are those of :func:`attnlab.generation.generate` (greedy; left padding;
``eos_id``; past the model's context each step runs the last ``context`` tokens again from
position 0, with an empty past) and :func:`attnlab.generation.greedy_decode` (bos first, pad
never chosen, pad after eos, ``max_len`` = source length + 50 at most the model's), so their
tokens are attnlab's. Arrays in and out are numpy (torch CPU tensors are accepted); each step
feeds the graph's outputs ``present.X`` back as its inputs ``past_key_values.X``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.errors import BadInput, MissingDependency, MissingFile, UnsupportedFormat

MANIFEST = "export.json"  # as onnx_export writes it (not imported: no torch.onnx at run time)


class _Graph:
    """One ONNX graph in an onnxruntime session: ``run(feeds)`` -> ``{output name: array}``."""

    def __init__(self, path: Path, threads: int | None, spinning: bool = True):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads is not None:  # the same pool size as torch's, for a fair comparison
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        if not spinning:  # idle threads sleep at once instead of taking the cores from torch
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(str(path), options,
                                                    providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i.shape for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds), strict=True))

    def empty_past(self, batch: int, part: str = "") -> dict[str, np.ndarray]:
        """The first step's ``past_key_values.*{part}*`` inputs: ``(batch, kv_heads, 0, d_k)``
        float32 arrays."""
        return {name: np.zeros((batch, shape[1], 0, shape[3]), np.float32)
                for name, shape in self.inputs.items()
                if name.startswith("past_key_values.") and part in name}


def as_past(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``present.X`` outputs renamed as the next step's ``past_key_values.X`` inputs."""
    return {"past_key_values." + k.removeprefix("present."): v for k, v in outputs.items()
            if k.startswith("present.")}


def _ids(x: Any, what: str = "input_ids") -> np.ndarray:
    a = np.asarray(x, dtype=np.int64)
    if a.ndim != 2 or a.shape[1] == 0:
        raise BadInput(f"{what} must be (batch, length >= 1) token ids, got shape {a.shape}")
    return a


class _Exported:
    """An export folder: its manifest, its model fields and a session per graph."""

    kind = ""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None,
                 spinning: bool = True):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        if self.manifest["kind"] != self.kind:
            raise UnsupportedFormat(f"{self.folder}: holds {self.manifest['kind']!r} graphs, not "
                                    f"{self.kind!r}")
        self.config: dict[str, Any] = self.manifest["model"]
        self.graphs = {name: _Graph(self.folder / g["file"], threads, spinning)
                       for name, g in self.manifest["graphs"].items()}


class OnnxEncoder(_Exported):
    """A BERT-family ``encoder.onnx``: ``__call__`` -> ``{"last_hidden_state": (batch, seq,
    d_model), "logits": the head's output, …}``."""

    kind = "encoder"

    def __call__(self, input_ids: Any, attention_mask: Any = None,
                 token_type_ids: Any = None) -> dict[str, np.ndarray]:
        ids = _ids(input_ids)
        limit = self.config["max_len"] - self.config["position_offset"]
        if ids.shape[1] > limit:  # the graph holds no check: past the table it would fail
            raise BadInput(f"sequence of {ids.shape[1]} tokens exceeds the model's context of "
                           f"{limit} tokens")
        graph = self.graphs["encoder"]
        feeds = {"input_ids": ids,
                 "attention_mask": (np.ones_like(ids) if attention_mask is None
                                    else np.asarray(attention_mask, dtype=np.int64))}
        if "token_type_ids" in graph.inputs:
            feeds["token_type_ids"] = (np.zeros_like(ids) if token_type_ids is None
                                       else np.asarray(token_type_ids, dtype=np.int64))
        return graph.run(feeds)


class OnnxDecoder(_Exported):
    """A decoder-only ``decoder.onnx`` (GPT-2, Llama, Mistral) and its greedy loop."""

    kind = "decoder"

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray,
             past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One call: new ``input_ids (batch, seq)``, ``attention_mask (batch, past + seq)`` and
        the past -> ``logits (batch, seq, vocab)`` and the next past."""
        out = self.graphs["decoder"].run({"input_ids": input_ids,
                                          "attention_mask": attention_mask, **past})
        return out["logits"], as_past(out)

    def generate(self, ids: Any, max_new_tokens: int, attention_mask: Any = None,
                 eos_id: int | None = None) -> np.ndarray:
        """Greedy: ``ids (batch, prompt_len)`` (left padded, with ``attention_mask``) ->
        ``(batch, prompt_len + new)``; rows that produced ``eos_id`` continue with it, and
        decoding stops when all have (as :func:`attnlab.generation.generate`)."""
        ids = _ids(ids, "the prompt")
        if max_new_tokens < 0:
            raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        batch, prompt_len = ids.shape
        mask = (np.ones_like(ids) if attention_mask is None
                else np.asarray(attention_mask, dtype=np.int64))
        mask = np.concatenate([mask, np.ones((batch, max_new_tokens), np.int64)], axis=1)
        window = self.config["context"]
        start = 0 if window is None else max(0, prompt_len - window)
        graph = self.graphs["decoder"]
        past = graph.empty_past(batch)
        out = np.zeros((batch, prompt_len + max_new_tokens), np.int64)
        out[:, :prompt_len] = ids
        length, done = prompt_len, np.zeros(batch, bool)
        step_input = ids[:, start:]
        for _ in range(max_new_tokens):
            if window is not None and length - start > window:  # slide: no past, from 0
                start, past = length - window, graph.empty_past(batch)
                step_input = out[:, start:length]
            logits, past = self.step(step_input, mask[:, start:length], past)
            next_token = logits[:, -1].argmax(-1)
            if eos_id is not None:
                next_token = np.where(done, eos_id, next_token)
                done |= next_token == eos_id
            out[:, length] = next_token
            length += 1
            step_input = out[:, length - 1 : length]
            if eos_id is not None and done.all():
                break
        return out[:, :length]


class OnnxTranslator(_Exported):
    """An encoder–decoder's ``encoder.onnx`` and ``decoder.onnx`` and their greedy loop."""

    kind = "encoder-decoder"

    def greedy_decode(self, src_ids: Any, max_len: int | None = None) -> np.ndarray:
        """``src_ids (batch, src_len)`` (padded with pad_id) -> ``tokens (batch, out_len)``
        from bos, pad after each row's eos (as :func:`attnlab.generation.greedy_decode`)."""
        c = self.config
        src = _ids(src_ids, "src_ids")
        batch = src.shape[0]
        max_len = min(src.shape[1] + 50 if max_len is None else max_len, c["max_len"])
        encoded = self.graphs["encoder"].run({"input_ids": src})
        decoder = self.graphs["decoder"]
        fixed = {"encoder_attention_mask": (src != c["pad_id"]).astype(np.int64),
                 **as_past(encoded)}  # the cross-attention keys/values, for every step
        past = decoder.empty_past(batch, ".decoder.")
        tokens = np.full((batch, 1), c["bos_id"], np.int64)
        done = np.zeros(batch, bool)
        for _ in range(max_len - 1):
            out = decoder.run({"input_ids": tokens[:, -1:], **fixed, **past})
            past = as_past(out)
            logits = out["logits"][:, -1]
            logits[:, c["pad_id"]] = -np.inf  # padding is never a word of the output
            next_token = np.where(done, c["pad_id"], logits.argmax(-1))
            tokens = np.concatenate([tokens, next_token[:, None]], axis=1)
            done |= next_token == c["eos_id"]
            if done.all():
                break
        return tokens


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """``folder/export.json``, or a one-line error saying why it is not an ONNX export."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise MissingFile(f"{folder}: no {MANIFEST} (not a folder written by 'attnlab export "
                          "onnx')")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "attnlab-onnx":
        raise UnsupportedFormat(f"{path}: not an attnlab ONNX manifest")
    return manifest


def load_onnx(folder: str | os.PathLike, threads: int | None = None,
              spinning: bool = True) -> OnnxEncoder | OnnxDecoder | OnnxTranslator:
    """The runner for the export in ``folder``, its sessions on ``threads`` intra-op threads
    (None: onnxruntime's default). ``spinning`` False: onnxruntime's threads sleep as soon as
    a call ends instead of spin-waiting for the next (its default), so that another engine
    timed in the same process gets the cores."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise MissingDependency("running ONNX graphs needs the package onnxruntime (pip "
                                "install 'attnlab[export]')") from None
    kinds = {cls.kind: cls for cls in (OnnxEncoder, OnnxDecoder, OnnxTranslator)}
    kind = read_manifest(folder)["kind"]
    if kind not in kinds:
        raise UnsupportedFormat(f"{folder}: unknown kind {kind!r} in {MANIFEST}")
    return kinds[kind](folder, threads, spinning)


__all__ = ["OnnxDecoder", "OnnxEncoder", "OnnxTranslator", "as_past", "load_onnx", "read_manifest"]
