"""attnlab models as ONNX graphs for onnxruntime (``attnlab export onnx``).

One folder per model: the graphs, ``export.json`` (what each graph takes and gives, the opset,
the ids a runner needs, how far onnxruntime strayed from attnlab on the export's own inputs)
and ``tokenizers.json`` when the model has tokenizers. :mod:`attnlab.interop.onnx_run` runs
them. All axes named below are dynamic; ``N`` is the number of layers, ``i`` = 0 … N − 1:

* ``encoder`` (BERT and its configurations) — ``encoder.onnx``::

      input_ids, attention_mask (1 = real token)  (batch, seq) int64
      token_type_ids                              (batch, seq) int64, if the model has segments
      -> last_hidden_state                        (batch, seq, d_model)
         logits                                   the head's output, as BERT.forward gives it:
             mlm (batch, seq, vocab), classify (batch, labels), tokens (batch, seq, labels),
             discriminator (batch, seq); pretraining also seq_relationship_logits (batch, 2);
             head none: no logits

* ``decoder`` (GPT-2, Llama, Mistral) — ``decoder.onnx``, Hugging Face optimum's names::

      input_ids                                   (batch, seq) int64: the new tokens
      attention_mask                              (batch, past + seq) int64 over the cached and
                                                  the new tokens (left padding)
      past_key_values.{i}.key / .value            (batch, kv_heads, past, d_k)
      -> logits                                   (batch, seq, vocab)
         present.{i}.key / .value                 (batch, kv_heads, past + seq, d_k)

  Positions count from each row's first real token, as ``generate`` counts them.

* ``encoder-decoder`` (the Transformer; T5, Marian) — ``encoder.onnx`` and ``decoder.onnx``::

      encoder: input_ids (batch, src) -> last_hidden_state (batch, src, d_model),
               present.{i}.encoder.key / .value (batch, kv_heads, src, d_k): every decoder
               layer's cross-attention keys and values, computed once per sentence
      decoder: input_ids (batch, seq), encoder_attention_mask (batch, src) (source ≠ pad),
               past_key_values.{i}.decoder.key / .value (batch, kv_heads, past, d_k),
               past_key_values.{i}.encoder.key / .value (batch, kv_heads, src, d_k)
               -> logits (batch, seq, target vocab),
                  present.{i}.decoder.key / .value (batch, kv_heads, past + seq, d_k)

A runner feeds every output ``present.X`` back as the input ``past_key_values.X``. The first
step passes a past of length 0 (``(batch, kv_heads, 0, d_k)`` arrays): one graph serves the
prompt and every step after it.

attnlab's KV caches write into preallocated buffers in place, which a graph cannot keep between
calls. While exporting, a functional cache (:class:`_Past`: ``append`` concatenates the given
past and the new keys/values, and the result becomes an output) stands in for them, and the
models' own forward code runs unchanged. A sliding window (Mistral) is then a band in the mask
over a growing past, not a rolling buffer.

The exporter is ``torch.onnx.export(dynamo=True)``: ``torch.export`` traces symbolic sizes, so
batch, sequence and past lengths stay variables of the graph. The TorchScript exporter
(``dynamo=False``) traces sizes as tensors and fails inside attention (``enable_gqa`` must be
a bool). The model code's value checks (token ids, positions within their table, rows with
nothing to attend) are skipped while exporting: a graph cannot raise, and keeps both paths.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput, MissingDependency, UnsupportedFormat, WriteFailed

KINDS = ("encoder", "decoder", "encoder-decoder")
MANIFEST = "export.json"
FORMAT = "attnlab-onnx"
# example sizes for tracing: distinct, and >= 2 so that torch.export keeps each one symbolic
_BATCH, _SEQ, _PAST, _SRC = 2, 3, 4, 5


def require_onnx() -> None:
    """A one-line error unless the exporter's packages (onnx, onnxscript) are installed."""
    for name in ("onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            raise MissingDependency(f"ONNX export needs the package {name} (pip install "
                                    "'attnlab[export]')") from None


def check_destination(out: str | os.PathLike) -> Path:
    """``out`` as a folder that may be (re)written: new, empty, or an earlier ONNX export."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise BadInput(f"--out {out}: a folder with other files in it (no {MANIFEST}); name a "
                       "new folder")
    return out


def check_exportable(model: nn.Module, name: str | os.PathLike | None = None) -> str:
    """The model's kind (its config's arch), or a one-line error saying why it cannot be
    exported (naming ``name``, the file or folder it came from, when given)."""
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    where = "" if name is None else f"{name}: "
    c = getattr(model, "config", None)
    if c is None or c.arch not in KINDS:
        arch = getattr(c, "arch", type(model).__name__)
        raise UnsupportedFormat(f"{where}ONNX export writes encoder, decoder and "
                                f"encoder-decoder models, not arch={arch!r}")
    if (c.rope_scaling or {}).get("rope_type") == "dynamic":
        raise UnsupportedFormat(f"{where}rope_scaling 'dynamic' cannot be exported: its angles "
                                "depend on the longest position of each call")
    if any(isinstance(m, (Int8Linear, Int4Linear)) for m in model.modules()):
        raise UnsupportedFormat(f"{where}quantised (int8/int4) layers cannot be exported to "
                                "ONNX; export the float model")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        raise BadInput(f"{where}ONNX export writes float32 graphs; the weights are {names}")
    return c.arch


# --- the functional cache ---------------------------------------------------------------------
class _Past:
    """One attention module's keys and values as graph values, with the protocol of
    :class:`attnlab.nn.cache.KVCache` that attention reads (``static``, ``filled``,
    ``append``, ``k``, ``v``).

    Growing (self-attention): ``append`` returns the past ``(batch, kv_heads, past, d_k)``
    concatenated with the new ``(batch, kv_heads, new, d_k)`` and keeps it as ``k``, ``v``: the
    graph's present. Static (cross-attention): given keys/values are reused as they are; an
    empty static one keeps what its first ``append`` brings."""

    def __init__(self, k: Tensor | None = None, v: Tensor | None = None, static: bool = False):
        self.k, self.v, self.static = k, v, static

    @property
    def filled(self) -> bool:
        return self.k is not None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not self.static:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class _Layers(list):
    """The per-layer caches of a stack: ``length`` past positions (a symbolic size while
    exporting), keys in time order (``key_index`` None: not a rolling buffer)."""

    def __init__(self, layers: list, length: int):
        super().__init__(layers)
        self.length = length

    def key_index(self, new: int, device=None) -> None:
        return None


# --- the graphs ------------------------------------------------------------------------------
class _Graph(nn.Module):
    """A graph's forward pass around ``model`` (whose weights become the graph's
    initialisers)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class _EncoderGraph(_Graph):
    """BERT: ``(input_ids, attention_mask[, token_type_ids])`` -> the last hidden state and the
    head's output(s), from one run of :meth:`BERT.forward` (a hook on the encoder stack keeps
    the hidden state the head reads)."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        hidden: list[Tensor] = []
        hook = self.model.encoder.register_forward_hook(lambda m, a, out: hidden.append(out))
        try:
            out = self.model(input_ids, token_type_ids, attention_mask)
        finally:
            hook.remove()
        if self.model.config.head == "none":
            return (hidden[0],)
        return (hidden[0], *(out if isinstance(out, tuple) else (out,)))


class _DecoderGraph(_Graph):
    """GPT: ``(input_ids, attention_mask, k₀, v₀, k₁, …)`` -> ``(logits, present k₀, v₀, …)``
    through :meth:`GPT.forward` with a functional cache; positions come from the mask, as
    ``generate`` makes them."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, *past: Tensor):
        caches = _Layers([_Past(past[j], past[j + 1]) for j in range(0, len(past), 2)],
                         past[0].shape[2])
        logits = self.model(input_ids, cache=caches, attention_mask=attention_mask)
        return (logits, *[t for c in caches for t in (c.k, c.v)])


class _Seq2SeqEncoderGraph(_Graph):
    """Transformer: ``input_ids (batch, src)`` -> memory and each decoder layer's
    cross-attention keys/values."""

    def forward(self, input_ids: Tensor) -> tuple[Tensor, ...]:
        memory, _ = self.model.encode(input_ids)
        out = [memory]
        for layer in self.model.decoder.layers:
            # attention fills an empty static cache with memory's keys and values; the one
            # query's attention itself is dead code, which the exporter's optimiser drops
            cross = _Past(static=True)
            layer.cross_attn(memory[:, :1], context=memory, cache=cross)
            out += [cross.k, cross.v]
        return tuple(out)


class _Seq2SeqDecoderGraph(_Graph):
    """Transformer: ``(input_ids, encoder_attention_mask, then per layer the decoder's past k,
    v and the cross-attention k, v)`` -> ``(logits, present k₀, v₀, …)`` via
    :meth:`Transformer.decode`."""

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *past: Tensor):
        layers = [types.SimpleNamespace(self_attn=_Past(past[j], past[j + 1]),
                                        cross_attn=_Past(past[j + 2], past[j + 3], static=True))
                  for j in range(0, len(past), 4)]
        caches = _Layers(layers, past[0].shape[2])
        src_mask = encoder_attention_mask.bool()[:, None, None, :]
        # cross-attention reads the given keys/values, never memory: any tensor stands in
        logits = self.model.decode(input_ids, past[2], src_mask, cache=caches)
        return (logits, *[t for layer in layers for t in (layer.self_attn.k, layer.self_attn.v)])


# --- what each graph is traced with ------------------------------------------------------------
def _kv_shapes(layers, attention: str = "self_attn") -> list[tuple[int, int]]:
    """``(kv_heads, d_k)`` of each layer's attention module (pruned layers may have fewer)."""
    return [(getattr(x, attention).num_kv_heads, getattr(x, attention).d_k) for x in layers]


def _mask(length: int, device, left: bool = True) -> Tensor:
    """An example ``(batch, length)`` attention mask whose first row has one pad."""
    mask = torch.ones(_BATCH, length, dtype=torch.long, device=device)
    mask[0, 0 if left else -1] = 0
    return mask


def _graphs(model: nn.Module, kind: str) -> list[dict[str, Any]]:
    """For each graph: its file, module, example arguments, argument names, output names and
    dynamic shapes (``torch.export.Dim`` per axis)."""
    from torch.export import Dim

    c, dev = model.config, next(model.parameters()).device
    b, seq, past, src = Dim("batch"), Dim("seq"), Dim("past"), Dim("src")
    total = Dim("past_seq")  # the mask spans past + seq; torch.export ties it to both

    def ids(n: int, vocab: int = c.vocab_size) -> Tensor:
        return torch.randint(0, vocab, (_BATCH, n), device=dev)

    def kv(shapes, n: int) -> list[Tensor]:
        return [torch.randn(_BATCH, h, n, d, device=dev) for h, d in shapes for _ in "kv"]

    if kind == "encoder":
        args = [ids(_SEQ), _mask(_SEQ, dev, left=False)]
        names = ["input_ids", "attention_mask"]
        if model.segment is not None:
            args.append(torch.zeros_like(args[0]))
            names.append("token_type_ids")
        outputs = ["last_hidden_state"]
        if c.head != "none":
            outputs.append("logits")
        if c.head == "pretraining":
            outputs.append("seq_relationship_logits")
        return [dict(file="encoder.onnx", module=_EncoderGraph(model), args=args, names=names,
                     outputs=outputs, shapes={n: {0: b, 1: seq} for n in names})]
    if kind == "decoder":
        layers = model.blocks.layers
        n = range(len(layers))
        past_names = [f"past_key_values.{i}.{t}" for i in n for t in ("key", "value")]
        return [dict(file="decoder.onnx", module=_DecoderGraph(model),
                     args=[ids(_SEQ), _mask(_PAST + _SEQ, dev),
                           *kv(_kv_shapes(layers), _PAST)],
                     names=["input_ids", "attention_mask", *past_names],
                     outputs=["logits"] + [f"present.{i}.{t}" for i in n for t in ("key", "value")],
                     shapes={"input_ids": {0: b, 1: seq}, "attention_mask": {0: b, 1: total},
                             "past": tuple({0: b, 2: past} for _ in past_names)})]
    layers = model.decoder.layers
    n = range(len(layers))
    src_ids = ids(_SRC)
    src_ids[0, -1] = c.pad_id
    encoder = dict(file="encoder.onnx", module=_Seq2SeqEncoderGraph(model), args=[src_ids],
                   names=["input_ids"],
                   outputs=["last_hidden_state"] + [f"present.{i}.encoder.{t}" for i in n
                                                    for t in ("key", "value")],
                   shapes={"input_ids": {0: b, 1: src}})
    past_args, past_names, past_shapes = [], [], []
    own, cross = kv(_kv_shapes(layers), _PAST), kv(_kv_shapes(layers, "cross_attn"), _SRC)
    for i in n:
        past_args += [own[2 * i], own[2 * i + 1], cross[2 * i], cross[2 * i + 1]]
        past_names += [f"past_key_values.{i}.{s}.{t}" for s in ("decoder", "encoder")
                       for t in ("key", "value")]
        past_shapes += [{0: b, 2: past}] * 2 + [{0: b, 2: src}] * 2
    decoder = dict(file="decoder.onnx", module=_Seq2SeqDecoderGraph(model),
                   args=[ids(_SEQ, c.target_vocab_size), (src_ids != c.pad_id).long(), *past_args],
                   names=["input_ids", "encoder_attention_mask", *past_names],
                   outputs=["logits"] + [f"present.{i}.decoder.{t}" for i in n
                                         for t in ("key", "value")],
                   shapes={"input_ids": {0: b, 1: seq}, "encoder_attention_mask": {0: b, 1: src},
                           "past": tuple(past_shapes)})
    return [encoder, decoder]


# --- writing ---------------------------------------------------------------------------------
def export_onnx(model: nn.Module, out: str | os.PathLike,
                tokenizers: dict[str, dict] | None = None, verify: bool = True) -> dict[str, Any]:
    """Write ``model``'s graphs (see the module docstring), ``export.json`` and, given
    ``tokenizers`` (role -> ``Tokenizer.to_dict()``), ``tokenizers.json`` into the folder
    ``out``; returns the manifest (``export.json``'s content).

    The folder is written beside its name and renamed into place (an earlier export there is
    replaced). With ``verify`` and onnxruntime installed, each graph runs on the inputs it was
    traced with, and its largest absolute difference from attnlab's outputs is recorded as
    ``max_abs_error``."""
    require_onnx()
    out = check_destination(out)
    kind = check_exportable(model)
    c, was_training = model.config, model.training
    model.eval()
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        graphs, opset = {}, None
        for graph in _graphs(model, kind):
            entry, opset = _export_graph(graph, tmp, verify)
            graphs[Path(graph["file"]).stem] = entry
        manifest = {
            "format": FORMAT, "version": 1, "kind": kind, "opset": opset,
            "exporter": f"torch {torch.__version__}, torch.onnx.export(dynamo=True)",
            "model": {"vocab_size": c.vocab_size, "target_vocab_size": c.target_vocab_size,
                      "max_len": c.max_len, "context": c.context,
                      "position_offset": c.position_offset, "head": c.head,
                      "pad_id": c.pad_id, "bos_id": c.bos_id, "eos_id": c.eos_id},
            "graphs": graphs,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if tokenizers:
            (tmp / "tokenizers.json").write_text(json.dumps(tokenizers, ensure_ascii=False))
        old = out.parent / f".tmp-old-{out.name}-{os.getpid()}"
        if out.exists():  # an earlier export (check_destination allowed it): swap, then drop
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteFailed(f"{out}: could not be written ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        model.train(was_training)
    return manifest


def _export_graph(graph: dict[str, Any], folder: Path, verify: bool) -> tuple[dict, int]:
    """Export one graph into ``folder``; its manifest entry and the ONNX opset."""
    with torch.no_grad(), _quiet():
        program = torch.onnx.export(
            graph["module"], tuple(graph["args"]), dynamo=True, input_names=graph["names"],
            output_names=graph["outputs"], dynamic_shapes=graph["shapes"], optimize=True,
            verbose=False)
    path = folder / graph["file"]
    program.save(path)
    ir_graph = program.model.graph
    entry = {"file": graph["file"], "inputs": [_describe(v) for v in ir_graph.inputs],
             "outputs": [_describe(v) for v in ir_graph.outputs]}
    if verify:
        entry["max_abs_error"] = _max_abs_error(path, graph)
    return entry, program.model.opset_imports[""]


def _describe(value) -> dict[str, Any]:
    """An ONNX graph input or output: name, shape (a name for each dynamic axis), dtype."""
    shape = [d if isinstance(d, int) else str(d.value) for d in value.shape]
    return {"name": value.name, "shape": shape, "dtype": value.dtype.numpy().name}


def _max_abs_error(path: Path, graph: dict[str, Any]) -> float | None:
    """Largest |onnxruntime − attnlab| over the graph's outputs on its example inputs; None
    without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {n: a.cpu().numpy() for n, a in zip(graph["names"], graph["args"], strict=True)}
    theirs = session.run(graph["outputs"], feeds)
    with torch.no_grad():
        ours = graph["module"](*graph["args"])
    return max(float(abs(t - o.cpu().numpy()).max()) for t, o in zip(theirs, ours, strict=True))


@contextmanager
def _quiet():
    """Silence the exporter's progress warnings (a missing torchvision, axis renames), so that
    a command prints its own one line."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export",
                                              "torch.fx.experimental")]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for log in loggers:
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for log, level in zip(loggers, levels, strict=True):
                log.setLevel(level)


__all__ = ["KINDS", "MANIFEST", "check_destination", "check_exportable", "export_onnx",
           "require_onnx"]
