"""``attnlab quantize`` and ``attnlab prune``: a model folder made smaller.

* ``quantize``: post-training weight-only quantisation (int8 per channel, int4 or int2 in
  groups), or int8 weights with dynamic int8 activations for encoders, for every family. The
  output is a model folder with ``quantization.json`` (:mod:`attnlab.compression.quantize`),
  which :func:`attnlab.load`, and so every command, reads.
* ``prune``: attention heads removed by importance on data (a classifier on labelled JSON
  lines, a language model on text), or weights zeroed by magnitude
  (:mod:`attnlab.compression.prune`); feed-forward channels removed by weight magnitude, or
  whole layers by how much the final hidden states on a text change without them
  (:mod:`attnlab.compression.structured`). The output is a model folder whose config records
  what is gone (``pruned_heads``, a smaller ``d_ff`` or layer count).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg
from attnlab.files import read_text


def _size(path: Path) -> int:
    """Bytes on disk of a file, or of a folder's files."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _engine() -> str:
    import torch

    return torch.backends.quantized.engine


def cmd_quantize(args: argparse.Namespace) -> None:
    import warnings

    import torch
    from torch import nn

    from attnlab.compression.quantize import (
        SPEC_FILE,
        check,
        quantize_model,
        slow_here,
        write_spec,
    )
    from attnlab.nn.quantized import float_dtype
    from attnlab.storage import load, save_model_dir

    check(args.bits, args.group, args.activations)
    loaded = load(args.model, adapter=args.adapter)
    model = loaded.model
    if args.activations == "dynamic" and loaded.kind != "encoder":
        raise UsageError(f"--activations dynamic is for encoders (BERT, MiniLM); {args.model} "
                         f"is a {loaded.kind} model: quantise its weights only")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if args.bits < 8:  # every layer the codes can take must split into whole groups
        for name, layer in linears.items():
            if not name.endswith("lm_head") and layer.in_features % args.group:
                raise UsageError(f"--group {args.group} does not divide the width "
                                 f"{layer.in_features} of {name}")
    slow = slow_here(args.activations)
    if slow:  # said where the model is made; every load of it says it again
        warnings.warn(slow, stacklevel=2)
    spec = quantize_model(model, args.bits, args.group, args.activations)
    if args.activations != "dynamic":  # on disk in bf16 whatever this CPU runs them in
        model.to(torch.bfloat16)
    kept = [n for n in linears if n not in spec["modules"]]
    folder = save_model_dir(args.out, model, loaded.config,
                            {k: t.to_dict() for k, t in loaded.tokenizers.items()},
                            extra_files={SPEC_FILE: write_spec(spec)})
    what = {8: "int8, one scale per output channel", 4: f"int4 in groups of {args.group}",
            2: f"int2 in groups of {args.group}"}[args.bits]
    kernel = ("; activations int8 per call, PyTorch's quantized::linear_dynamic on its "
              f"'{_engine()}' engine" if args.activations == "dynamic" else
              "; attnlab's int8 kernel for a few rows, a "
              f"{str(float_dtype()).removeprefix('torch.')} GEMM for many"
              if args.bits == 8 else "; attnlab's int4 kernel for a few rows, a "
              f"{str(float_dtype()).removeprefix('torch.')} GEMM for many")
    print(f"quantised {len(spec['modules'])} linear layers to {what}{kernel}")
    for name in kept:
        layer = linears[name]
        if name.endswith("lm_head"):
            tied = getattr(model, "embed", None) is not None and layer.weight is model.embed.weight
            why = "the output projection" + (", tied to the embedding" if tied else "")
        else:
            why = f"{layer.out_features} outputs; the int4 kernel tiles 16 rows"
        print(f"kept in float: {name} ({why})")
    if args.bits == 2:
        print("note: there is no 2-bit kernel: the codes are stored at 2 bits and run "
              "through the 4-bit one (4 bits in memory, int4's speed)")
    rest = ("float32 (the dynamic int8 GEMM's input)" if args.activations == "dynamic"
            else f"bfloat16, run in {str(float_dtype()).removeprefix('torch.')} on this CPU")
    print(f"the other weights (embeddings, norms) in {rest}")
    before = _size(Path(loaded.path))
    print(f"{_size(folder) / 2**20:,.1f} MiB on disk (from {before / 2**20:,.1f} MiB)")
    print(f"model in {folder}")


def _importance_batches(args: argparse.Namespace, loaded) -> tuple[list, object]:
    """``(batches, loss_fn)`` for head importance: a classifier's cross-entropy on labelled
    examples, or a language model's next-token cross-entropy on windows of a text."""
    import torch.nn.functional as F

    config = loaded.config
    if config.arch == "encoder" and config.head == "classify":
        from attnlab.data.labelled import fixed_batches
        from attnlab.tasks.classify import encode_examples, read_labelled

        if not (args.text_field and args.label_field):
            raise UsageError("a classifier is pruned on labelled data: give --text-field and "
                             "--label-field")
        labels = config.extra.get("labels") or [str(i) for i in range(config.num_labels)]
        rows = encode_examples(read_labelled(args.data, args.text_field, args.label_field),
                               loaded.tokenizer, labels, loaded.max_len)
        batches = fixed_batches(rows, args.batch, loaded.tokenizer.pad_id)[: args.batches]

        def loss(model, b):
            return F.cross_entropy(model(b.ids, b.token_type_ids, b.attention_mask), b.labels)

        return batches, loss
    if config.arch == "decoder":
        batches = _lm_windows(args, loaded)

        def loss(model, w):
            logits = model(w[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten())

        return batches, loss
    raise UsageError(f"{args.model}: head importance is measured for a classifier (encoder "
                     f"with a classify head) or a language model; this is a {config.arch} "
                     f"model with head {config.head!r}")


def _lm_windows(args: argparse.Namespace, loaded) -> list:
    """Windows of ``--block + 1`` tokens of the text ``--data``, ``--batch`` a batch, the first
    ``--batches`` batches."""
    import torch

    ids = torch.tensor(loaded.tokenizer.encode(read_text(args.data)))
    block = min(args.block, loaded.config.context or args.block)
    if len(ids) < block + 1:
        raise UsageError(f"{args.data}: {len(ids)} tokens, fewer than one window of "
                         f"--block {block} + 1")
    starts = list(range(0, len(ids) - block, block))
    windows = torch.stack([ids[s : s + block + 1] for s in starts])
    return list(windows.split(args.batch))[: args.batches]


def _hidden_batches(args: argparse.Namespace, loaded) -> tuple[list, object]:
    """``(batches, run)`` for layer importance: ``run(model, batch)`` runs the model on a batch
    and returns its real tokens (None: all). A language model reads windows of the text; an
    encoder–decoder translates each line of it with the whole model (greedy) and is then run
    on those pairs, the decoder's real tokens up to each translation's end; an encoder reads
    each line."""
    import copy

    import torch

    from attnlab.files import read_lines
    from attnlab.tokenizers import pad

    config = loaded.config
    if config.arch == "decoder":
        def lm_run(model, ids):
            model(ids)  # every token of a window is real

        return [w[:, :-1] for w in _lm_windows(args, loaded)], lm_run
    if config.arch not in ("encoder-decoder", "encoder"):
        raise UsageError(f"{args.model}: layer importance is measured on text, for a language "
                         f"model, a translator or a text encoder; this is a {config.arch} model")
    lines = [line for line in read_lines(args.data) if line.strip()]
    lines = lines[: args.batch * args.batches]
    if not lines:
        raise UsageError(f"{args.data}: no lines of text to measure the layers on")
    limit = loaded.max_len
    if config.arch == "encoder":
        tok = loaded.tokenizer
        encode = getattr(tok, "encode_single", tok.encode)
        batches = []
        for start in range(0, len(lines), args.batch):
            ids = pad([encode(t)[:limit] for t in lines[start : start + args.batch]],
                      config.pad_id)
            batches.append((ids, ids != config.pad_id))

        def encoder_run(model, batch):
            ids, real = batch
            model(ids, attention_mask=real)
            return real

        return batches, encoder_run
    from attnlab.generation.seq2seq import greedy_decode

    loaded.expect("encoder-decoder", "prune --layers")
    src_tok = loaded.tokenizers["source"]
    decoder = copy.deepcopy(loaded.model).eval()  # decoding may put kernels in its layers
    sources = [src_tok.encode(t, add_eos=True)[:limit] for t in lines]
    longest = max(map(len, sources)) + 50  # one limit for all: a line's translation is its own
    batches = []
    for start in range(0, len(lines), args.batch):
        src = pad(sources[start : start + args.batch], config.pad_id)
        with torch.no_grad():
            tgt = greedy_decode(decoder, src, max_len=longest)
        ends = (tgt == config.eos_id).long().cumsum(1)  # real: up to and with the first eos
        real = (ends == 0) | ((ends == 1) & (tgt == config.eos_id))
        batches.append((src, tgt, real))

    def translator_run(model, batch):
        src, tgt, real = batch
        model(src, tgt)
        return real

    return batches, translator_run


def _prune_structure(args: argparse.Namespace, loaded, model) -> object:
    """``--ffn`` or ``--layers`` on ``model``, in place; returns the new config."""
    from attnlab.compression import structured
    from attnlab.nn.feedforward import GATES

    if args.ffn is not None:
        d_ff = model.config.d_ff
        count = len(structured.feedforwards(model))
        config = structured.prune_channels(model, args.ffn)
        print(f"removed {d_ff - config.d_ff} of the {d_ff} channels of each of {count} "
              f"feed-forward layers, the smallest by sum |W1[j,:]| "
              f"{'+ sum |W3[j,:]| ' if config.activation in GATES else ''}+ sum |W2[:,j]|: "
              f"d_ff {d_ff} -> {config.d_ff}")
        return config
    stacks = structured.layer_stacks(model)
    total = sum(len(layers) for layers in stacks.values())
    if not 0 < args.layers <= total - len(stacks):
        raise UsageError(f"--layers {args.layers}: the model has {total} layers "
                         f"({', '.join(f'{len(v)} in {k}' for k, v in stacks.items())}) and "
                         f"{'each stack keeps' if len(stacks) > 1 else 'the stack keeps'} one, "
                         f"so 1 to {total - len(stacks)} can go")
    batches, run = _hidden_batches(args, loaded)
    scores = structured.layer_importance(model, batches, run)
    drop = structured.least_important_layers(scores, args.layers)
    config = structured.drop_layers(model, drop)
    print(f"removed {args.layers} of {total} layers, ranked by ||H_with - H_without||_F / "
          f"||H_with||_F of the final hidden states on {len(batches)} batches of {args.data}")
    for stack, values in scores.items():
        marks = ", ".join(f"{i}: {float(v):.4f}" + (" (removed)" if i in drop.get(stack, [])
                                                     else "") for i, v in enumerate(values))
        print(f"  {stack}: {marks}")
    return config


def cmd_prune(args: argparse.Namespace) -> None:
    import dataclasses

    from attnlab.compression import prune
    from attnlab.storage import load, save_model_dir

    given = [args.heads, args.ffn, args.layers, args.sparsity]
    if sum(v is not None for v in given) != 1:
        raise UsageError("give one of --heads, --ffn, --layers (structured) or --sparsity "
                         "(unstructured)")
    if args.ffn is not None and not 0 < args.ffn < 1:
        raise UsageError(f"--ffn must be a share of the feed-forward channels in (0, 1), got "
                         f"{args.ffn}")
    if args.layers is not None and not args.data:
        raise UsageError("--layers ranks layers by their importance on data: give --data")
    loaded = load(args.model, adapter=args.adapter)
    model, config = loaded.model.float(), loaded.config
    before = sum(p.numel() for p in model.parameters())
    if args.ffn is not None or args.layers is not None:
        config = _prune_structure(args, loaded, model)
    elif args.sparsity is not None:
        if not 0 <= args.sparsity < 1:
            raise UsageError(f"--sparsity must be in [0, 1), got {args.sparsity}")
        achieved = prune.magnitude_prune(model, args.sparsity)
        print(f"zeroed the smallest {args.sparsity:.0%} of each weight matrix of the layers: "
              f"{achieved:.1%} of them are zero (stored dense: no smaller or faster)")
    else:
        layers = prune.attention_layers(model)
        total = sum(m.n_heads for m in layers.values())
        count = round(args.heads * total)
        if not 0 < args.heads < 1 or count > total - len(layers):
            raise UsageError(f"--heads {args.heads}: the model has {total} heads in "
                             f"{len(layers)} attention layers and each keeps one, so at most "
                             f"{total - len(layers)} can go (--heads is a share, below "
                             f"{(total - len(layers) + 0.5) / total:.2f} here)")
        if not args.data:
            raise UsageError("--heads ranks heads by their importance on data: give --data")
        batches, loss = _importance_batches(args, loaded)
        scores = prune.head_importance(model, batches, loss)
        drop = prune.least_important(scores, count)
        pruned = prune.remove_heads(model, drop)
        config = dataclasses.replace(config, pruned_heads=pruned)
        model.config = config
        print(f"removed {count} of {total} heads, ranked by |dL/d gate| on {len(batches)} "
              f"batches of {args.data}")
        for path, layer in prune.attention_layers(model).items():
            print(f"  {path}: {layer.n_heads} heads left"
                  + (f" (removed {pruned[path]})" if path in pruned else ""))
    after = sum(p.numel() for p in model.parameters())
    print(f"parameters: {after:,} (from {before:,}, {after / before:.1%})")
    folder = save_model_dir(args.out, model, config,
                            {k: t.to_dict() for k, t in loaded.tokenizers.items()})
    print(f"model in {folder}")


def add_commands(sub) -> None:
    q = sub.add_parser(
        "quantize", help="post-training quantisation to int8, int4 or int2",
        description="Weight-only post-training quantisation of a model's linear layers: int8 "
                    "with one scale per output channel, int4 or int2 in groups of --group "
                    "inputs (a scale and a zero point each), or int8 weights with dynamic int8 "
                    "activations for encoders (PyTorch's quantized::linear_dynamic). The "
                    "output projection stays float. The result is a model folder every "
                    "command runs, on the CPU.")
    add_model_arg(q, "any model attnlab loads: a run or model folder, an HF folder, a .gguf "
                     "file, minilm, smollm2")
    q.add_argument("--bits", type=int, required=True, help="bits per weight: 8, 4 or 2")
    q.add_argument("--group", type=int, default=32,
                   help="inputs per scale for int4 and int2 (32, 64 or 128)")
    q.add_argument("--activations", choices=["float", "dynamic"], default="float",
                   help="int8 only: float (weight-only) or dynamic (activations quantised to "
                        "int8 at every call: fast where the CPU has VNNI or AMX)")
    add_out_arg(q, "the quantised model folder", required=True)
    q.set_defaults(func=cmd_quantize)

    p = sub.add_parser(
        "prune", help="remove attention heads, feed-forward channels or layers, or zero the "
                      "smallest weights",
        description="--heads: remove that share (or count) of all attention heads, the least "
                    "important first, ranked across layers by |dL/d gate| summed over --data "
                    "(Michel et al., 2019; per-layer normalised), each layer keeping one; the "
                    "heads' rows of W_Q, W_K, W_V and columns of W_O go, so the model gets "
                    "smaller and faster. --ffn: remove that share of every feed-forward "
                    "layer's channels, the smallest by weight magnitude. --layers: remove the "
                    "N layers the final hidden states on --data depend on least. --sparsity: "
                    "zero that share of each layer matrix's smallest weights (unstructured; "
                    "stored dense).")
    add_model_arg(p, "a classifier run or folder (BERT/MiniLM), a language model, or (--ffn, "
                     "--layers) a translator")
    p.add_argument("--heads", type=float, metavar="F",
                   help="share of all heads to remove, e.g. 0.25 or 0.5")
    p.add_argument("--ffn", type=float, metavar="F",
                   help="share of each feed-forward layer's channels to remove, the smallest "
                        "by sum |W1[j,:]| (+ sum |W3[j,:]|) + sum |W2[:,j]|; d_ff shrinks alike "
                        "in every layer")
    p.add_argument("--layers", type=int, metavar="N",
                   help="remove the N layers whose skipping changes the final hidden states "
                        "of --data least (||H_with - H_without||_F / ||H_with||_F), ranked "
                        "across the encoder and decoder stacks, each keeping one")
    p.add_argument("--sparsity", type=float, metavar="S",
                   help="share of each weight matrix to zero by magnitude")
    p.add_argument("--data", metavar="FILE",
                   help="what importance is measured on: labelled JSON lines for a classifier "
                        "(with --text-field, --label-field), a text file for a language model; "
                        "--layers: a text file, source sentences a line for a translator, "
                        "sentences a line for an encoder")
    p.add_argument("--text-field", help="classifier data: the text field (or F1,F2)")
    p.add_argument("--label-field", help="classifier data: the label field")
    p.add_argument("--batches", type=int, default=32, help="batches of --data to score on")
    p.add_argument("--batch", type=int, default=16, help="examples or windows per batch")
    p.add_argument("--block", type=int, default=256,
                   help="language model: tokens per window")
    add_out_arg(p, "the pruned model folder", required=True)
    p.set_defaults(func=cmd_prune)
