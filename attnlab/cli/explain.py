"""``attnlab explain`` (one sentence through the pipeline, checked as it goes) and
``attnlab plot`` (PNG pictures)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg
from attnlab.errors import AttnlabError


class CheckFailed(AttnlabError):
    """A stage recomputed by hand disagreed with the model's own forward pass."""


def cmd_explain(args: argparse.Namespace) -> None:
    from attnlab.explain.report import format_backward, format_text

    if args.backward:
        print(format_backward(dims=args.dims))
        return
    if not args.sentence:
        raise UsageError("give a sentence to explain (or --backward)")
    from attnlab.explain.subject import load_subject_model, make_subject
    from attnlab.explain.walkthrough import compare_word, walk

    sentences = [args.sentence] + ([args.compare] if args.compare else [])
    model, tok, label = load_subject_model(args.model, sentences, args.seed)
    subject = make_subject(model, tok, args.sentence, label)
    w = walk(subject, args.layer, args.head)
    compared = None
    if args.compare:
        other = make_subject(model, tok, args.compare, label)
        compared = compare_word(subject, other, args.word)
    print(format_text(w, args.dims, compared))
    if args.html:
        from attnlab.explain.html import write_html

        print(f"\nHTML page: {write_html(w, args.html, compared, args.dims)}")
    if not all(c.ok for c in w.checks):
        raise CheckFailed("a check failed (see above)")


def cmd_plot(args: argparse.Namespace) -> None:
    import torch

    from attnlab import viz

    out = Path(args.out)
    if args.what == "attention":
        from attnlab.explain.subject import load_subject_model, make_subject

        model, tok, label = load_subject_model(args.model, [args.sentence], args.seed)
        subject = make_subject(model, tok, args.sentence, label)
        weights = torch.stack(subject.run_model().weights)  # (layers, heads, seq, seq)
        viz.plot_attention_grid(weights, subject.tokens, out, title=f"self-attention: {label}")
    elif args.what == "cross":
        from attnlab.generation.translation import cross_attention
        from attnlab.storage import load

        if not args.model:
            raise UsageError("plot cross needs --model (a translation run or checkpoint)")
        loaded = load(args.model).expect("encoder-decoder", "plot cross")
        weights, src, out_pieces = cross_attention(loaded.model, loaded.tokenizers["source"],
                                                   loaded.tokenizers["target"], args.sentence)
        viz.plot_cross_attention(weights, src, out_pieces, out,
                                 title="cross-attention, last layer (mean of heads)")
    elif args.what == "positional":
        viz.plot_positional_encoding(args.max_len, args.d_model, out)
    else:  # schedule
        from attnlab.training.schedule import NoamSchedule

        schedule = NoamSchedule(args.d_model, args.warmup, args.factor)
        viz.plot_schedule(schedule, args.steps, out, title=f"lr = {args.factor} · "
                          f"{args.d_model}^-0.5 · min(step^-0.5, step · {args.warmup}^-1.5)")
    print(f"wrote {out}")


def add_commands(sub) -> None:
    ex = sub.add_parser(
        "explain", help="follow one sentence through an encoder layer, checked as it goes",
        description="Print every stage (tokens, ids, embeddings, positions, Q/K/V, scores, "
                    "scaling, mask, softmax, weighted sum, heads, W_O, residual + norm, "
                    "feed-forward) for one layer and head, with computed checks.")
    ex.add_argument("sentence", nargs="?", help="the sentence to follow")
    add_model_arg(ex, "minilm, a HF BERT folder or an attnlab run (default: a freshly "
                      "initialised tiny model)", required=False)
    ex.add_argument("--layer", type=int, default=0)
    ex.add_argument("--head", type=int, default=0)
    ex.add_argument("--dims", type=int, default=6, help="columns of each matrix to print")
    ex.add_argument("--compare", metavar="SENTENCE",
                    help="a second sentence: contextual vs static vectors of a shared word")
    ex.add_argument("--word", help="the shared word to compare (default: the longest)")
    ex.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    ex.add_argument("--backward", action="store_true",
                    help="print one head's gradients by the formulas, checked against autograd")
    ex.add_argument("--seed", type=int, default=0, help="seed of the tiny model")
    ex.set_defaults(func=cmd_explain)

    pl = sub.add_parser("plot", help="PNG pictures: attention grid, cross-attention, "
                                     "positional encoding, learning-rate schedule",
                        description="Draw a picture as a PNG file.")
    pl.add_argument("what", choices=["attention", "cross", "positional", "schedule"])
    pl.add_argument("sentence", nargs="?", default="the cat sat on the mat",
                    help="for attention / cross")
    add_model_arg(pl, "attention: minilm, a HF BERT folder or a run (default: tiny); cross: a "
                      "translation run or checkpoint", required=False)
    add_out_arg(pl, "the PNG file to write", required=True)
    pl.add_argument("--d-model", type=int, default=512)
    pl.add_argument("--max-len", type=int, default=100, help="positional: positions to draw")
    pl.add_argument("--warmup", type=int, default=4000)
    pl.add_argument("--factor", type=float, default=1.0)
    pl.add_argument("--steps", type=int, default=20000)
    pl.add_argument("--seed", type=int, default=0)
    pl.set_defaults(func=cmd_plot)
