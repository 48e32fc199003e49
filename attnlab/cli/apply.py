"""Applying an encoder (BERT) to texts: ``attnlab classify``, ``embed``, ``ner`` and ``qa``.
Each command loads the model (:mod:`attnlab.sentence_encoder`) and calls its task
(:mod:`attnlab.tasks`). (Training them is ``attnlab train mlm|classify|ner|qa``, in
:mod:`attnlab.cli.train`.)"""

from __future__ import annotations

import argparse
import contextlib
import json

from attnlab.cli.common import (
    UsageError,
    add_model_arg,
    add_runtime_args,
    announce,
    runtime,
    texts,
)


def _encoder(args: argparse.Namespace, head: str | None = None):
    """The ``--model`` encoder (with a ``head``, if given) on ``--device``; the context its
    forward passes run in; and what the announce line says of the precision. On a CPU, fp32
    and bf16 run the matrices packed once for oneDNN (:func:`attnlab.cpu.encoder.for_encoding`:
    bf16 products, float32 activations), elsewhere under autocast."""
    from attnlab import hardware
    from attnlab.cpu.encoder import PRECISIONS, for_encoding
    from attnlab.errors import UnsupportedFormat
    from attnlab.sentence_encoder import load_encoder

    device, precision = runtime(args)
    enc = load_encoder(args.model, args.adapter)
    if head is not None and enc.model.config.head != head:
        raise UnsupportedFormat(f"{enc.path}: model has head={enc.model.config.head!r}, not "
                                f"{head!r}, which '{args.command}' needs")
    enc.model.to(device)
    if device.type == "cpu" and precision in PRECISIONS and for_encoding(enc.model, precision):
        said = ("fp32, packed matrices" if precision == "fp32" else
                "bf16 products on packed matrices, float32 activations")
        return enc, device, contextlib.nullcontext, said
    return enc, device, lambda: hardware.autocast(device, precision), precision


def cmd_classify(args: argparse.Namespace) -> None:
    """The label, its probability and the text (a pair: both texts, a tab between them)."""
    from attnlab.tasks.classify import Example, classify_examples

    if args.pair and args.text:
        raise UsageError("give texts or --pair A B, not both")
    enc, device, precision_of, said = _encoder(args, head="classify")
    labels = enc.labels or [str(i) for i in range(enc.model.config.num_labels)]
    if args.pair:
        inputs = [Example(str(i), a, "", b) for i, (a, b) in enumerate(args.pair)]
    else:
        inputs = [Example(str(i), t, "") for i, t in enumerate(texts(args, skip_blank=True))]
    announce(args, enc.path, device, said)
    with precision_of():
        probs = classify_examples(enc, inputs, pool=args.pool, stride=args.stride,
                                  truncation=args.truncation)
    for e, p in zip(inputs, probs, strict=True):
        best = int(p.argmax())
        shown = e.text[:80] if e.pair is None else f"{e.text[:80]}\t{e.pair[:80]}"
        print(f"{labels[best]}\t{float(p[best]):.4f}\t{shown}")


def cmd_embed(args: argparse.Namespace) -> None:
    from attnlab.sentence_encoder import embed_sentences

    enc, device, precision_of, said = _encoder(args)
    inputs = texts(args, skip_blank=True)
    announce(args, enc.path, device, said)
    with precision_of():
        vectors = embed_sentences(enc, inputs, normalize=not args.no_normalize).float()
    if args.json:
        for text, v in zip(inputs, vectors, strict=True):
            print(json.dumps({"text": text, "embedding": [round(x, 6) for x in v.tolist()]}))
        return
    for i, (text, v) in enumerate(zip(inputs, vectors, strict=True)):
        head = ", ".join(f"{x:+.4f}" for x in v[:6].tolist())
        print(f"[{i}] {text}\n    ({v.shape[0]} dims) [{head}, ...]")
    if len(inputs) > 1:
        unit = vectors / vectors.norm(dim=-1, keepdim=True)
        cos = unit @ unit.T
        print("cosine similarity:")
        print("      " + "".join(f"{f'[{j}]':>8}" for j in range(len(inputs))))
        for i in range(len(inputs)):
            print(f"  [{i}] " + "".join(f"{float(cos[i, j]):8.4f}" for j in range(len(inputs))))


def cmd_ner(args: argparse.Namespace) -> None:
    """Each text with its entities in brackets, ``[ORG EU] rejects [MISC German] call``; with
    ``--json``, one object a text with each entity's type, text and character span."""
    from attnlab.tasks.ner.predict import tag_text

    enc, device, precision_of, said = _encoder(args, head="tokens")
    inputs = texts(args, skip_blank=True)
    announce(args, enc.path, device, said)
    for text in inputs:
        with precision_of():
            found = tag_text(enc.model, enc.tokenizer, text)
        if args.json:
            print(json.dumps({"text": text, "entities": [
                {"type": kind, "text": words, "start": a, "end": b}
                for kind, words, a, b in found]}))
            continue
        out, at = [], 0
        for kind, words, a, b in found:
            out += [text[at:a], f"[{kind} {words}]"]
            at = b
        print("".join([*out, text[at:]]))


def cmd_qa(args: argparse.Namespace) -> None:
    """The answer's text; with ``--json`` also its score and character span."""
    from attnlab.files import read_text
    from attnlab.tasks.qa.predict import answer, reading_window

    enc, device, precision_of, said = _encoder(args, head="qa")
    context = read_text(args.context)
    max_len, stride = reading_window(enc, args.max_len, args.stride)
    if args.max_answer_len < 1:
        raise UsageError(f"--max-answer-len must be at least 1, got {args.max_answer_len}")
    questions = texts(args, skip_blank=True)
    announce(args, enc.path, device, said)
    for question in questions:
        with precision_of():
            text, score, start, end = answer(enc.model, enc.tokenizer, question, context,
                                             max_len, stride, args.max_answer_len)
        if args.json:
            print(json.dumps({"question": question, "answer": text, "score": round(score, 4),
                              "start": start, "end": end}))
        else:
            print(text)


def add_commands(sub) -> None:
    c = sub.add_parser("classify", help="label texts with a fine-tuned classifier",
                       description="Print the predicted label, its probability and the text.")
    add_model_arg(c, "run folder from 'attnlab train classify'")
    c.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"),
                   help="classify the pair (A, B); repeat for more pairs")
    c.add_argument("--truncation", choices=["longest_first", "only_second"],
                   help="how a pair longer than the model's input is cut (default: as the run "
                        "trained, else longest_first)")
    c.add_argument("--pool", choices=["max", "mean"],
                   help="read long texts in overlapping windows, their logits pooled (default: "
                        "as the run trained; else one window, cut)")
    c.add_argument("--stride", type=int, metavar="N",
                   help="tokens consecutive windows share (default: the run's)")
    c.add_argument("text", nargs="*", help="texts (default: stdin, one per line)")
    add_runtime_args(c)
    c.set_defaults(func=cmd_classify)

    e = sub.add_parser("embed", help="sentence embeddings and their cosine similarities",
                       description="Mean-pool the encoder's output over real tokens, then "
                                   "L2-normalise (how all-MiniLM-L6-v2 is meant to be used).")
    add_model_arg(e, "minilm, a HF BERT folder or an attnlab run", required=False,
                  default="minilm")
    e.add_argument("--json", action="store_true", help="print full vectors as JSON lines")
    e.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    e.add_argument("text", nargs="*", help="sentences (default: stdin, one per line)")
    add_runtime_args(e)
    e.set_defaults(func=cmd_embed)

    n = sub.add_parser("ner", help="tag the named entities of texts",
                       description="Split each text into words as the model's tokenizer does, "
                                   "tag every word (BIO) from its first subword, and print "
                                   "the text with its entities in brackets.")
    add_model_arg(n, "a run folder from 'attnlab train ner'")
    n.add_argument("--json", action="store_true",
                   help="one JSON object a text: its entities' type, text, start and end")
    n.add_argument("text", nargs="*", help="texts (default: stdin, one per line)")
    add_runtime_args(n)
    n.set_defaults(func=cmd_ner)

    q = sub.add_parser("qa", help="answer questions from a context (extractive)",
                       description="Read the context in overlapping windows and print the "
                                   "span of it with the highest start + end logit.")
    add_model_arg(q, "a run folder from 'attnlab train qa'")
    q.add_argument("--context", required=True, metavar="FILE", help="a UTF-8 text file")
    q.add_argument("--max-len", type=int, help="window length in tokens (default: the run's)")
    q.add_argument("--stride", type=int, help="tokens windows share (default: the run's)")
    q.add_argument("--max-answer-len", type=int, default=30, help="longest answer, in tokens")
    q.add_argument("--json", action="store_true",
                   help="one JSON object a question: answer, score, start, end")
    q.add_argument("text", nargs="*", metavar="QUESTION",
                   help="questions (default: stdin, one per line)")
    add_runtime_args(q)
    q.set_defaults(func=cmd_qa)
