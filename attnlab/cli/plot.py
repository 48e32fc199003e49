"""``attnlab plot``: PNG pictures (an attention grid, a ViT's [CLS] attention rollout laid over
the image, cross-attention, positional encodings, the learning-rate schedule).

A plot that runs a model needs a sentence (none is made up) and announces the model on stderr
before it runs; input a plot would ignore (a sentence for ``plot schedule``) is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.common import UsageError, add_model_arg, add_out_arg, add_quiet_arg, announce
from attnlab.cli.explain import check_can_write, encoder_for, runs_on, vision_for
from attnlab.cli.training_options import SCHEDULE_NAMES, schedule_from_args

# the plots that run a model on a sentence, and an example of their arguments
EXAMPLES = {"attention": '"the cat sat on the mat"', "cross": '"forty-two" --model runs/demo',
            "lens": '"The capital of France is" --model smollm2'}


def cmd_plot(args: argparse.Namespace) -> None:
    import torch

    from attnlab import viz

    if args.image and args.what != "attention":
        raise UsageError(f"--image is for plot attention, not plot {args.what}")
    if args.image and args.sentence:
        raise UsageError("plot attention takes a sentence or --image, not both")
    if args.what in EXAMPLES and not args.sentence and not args.image:
        raise UsageError(f"plot {args.what} needs a sentence to run through the model, e.g. "
                         f"attnlab plot {args.what} {EXAMPLES[args.what]} --out {args.out}")
    if (args.layer is not None or args.head is not None) and (
            args.what != "attention" or args.image):
        raise UsageError("--layer and --head pick one map of plot attention for a sentence")
    if args.head is not None and args.layer is None:
        raise UsageError("--head needs --layer: the head of which layer?")
    if args.what == "cross" and not args.model:
        raise UsageError("plot cross needs --model (a translation run or checkpoint)")
    given = [name for name, value in (("sentence", args.sentence), ("--model", args.model))
             if value]
    if args.what not in EXAMPLES and given:
        raise UsageError(f"plot {args.what} takes no {' or '.join(given)}: it runs no model")
    out = Path(args.out)
    check_can_write(out, "--out")
    if args.what == "attention" and args.image:
        from attnlab.explain.image import image_attention

        model, image, name, label = vision_for(args, "plot attention --image")
        seen = image_attention(model, image)
        title = f"{name}\nmodel: {label}"
        if seen.predicted is not None:
            title += (f"\npredicted {seen.predicted} "
                      f"(p = {float(seen.probabilities[seen.predicted]):.2f})")
        viz.plot_image_attention(image[0], seen.cls_map, out, title=title)
    elif args.what == "attention":
        from attnlab.explain.subject import make_subject

        model, tok, label, *_ = encoder_for(args, [args.sentence])
        subject = make_subject(model, tok, args.sentence, label)
        weights = torch.stack(subject.run_model().weights)  # (layers, heads, seq, seq)
        title = f"self-attention: {label}"
        if args.layer is None:  # the overview: every layer and head
            viz.plot_attention_grid(weights, subject.tokens, out, title=title)
        else:
            layers, heads = weights.shape[:2]
            if not 0 <= args.layer < layers:
                raise UsageError(f"--layer {args.layer}: the model has layers 0..{layers - 1}")
            if args.head is None:
                viz.plot_attention_grid(weights[args.layer : args.layer + 1], subject.tokens,
                                        out, title=title, first_layer=args.layer)
            elif not 0 <= args.head < heads:
                raise UsageError(f"--head {args.head}: the layer has heads 0..{heads - 1}")
            else:
                viz.plot_attention_head(weights[args.layer, args.head], subject.tokens, out,
                                        title=f"{title}\nlayer {args.layer}, head {args.head}")
    elif args.what == "cross":
        from attnlab.generation.seq2seq import cross_attention
        from attnlab.storage import load

        loaded = load(args.model).expect("encoder-decoder", "plot cross")
        announce(args, loaded.path, *runs_on(loaded.model))
        weights, src, out_pieces = cross_attention(loaded.model, loaded.tokenizers["source"],
                                                   loaded.tokenizers["target"], args.sentence)
        viz.plot_cross_attention(weights, src, out_pieces, out,
                                 title="cross-attention, last layer (mean of heads)")
    elif args.what == "lens":
        _plot_lens(args, out)
    elif args.what == "positional":
        viz.plot_positional_encoding(args.max_len, args.d_model, out)
    else:  # schedule
        schedule, title = _schedule(args)
        viz.plot_schedule(schedule, args.steps, out, title=title)
    print(f"wrote {out}")


def _schedule(args: argparse.Namespace):
    """``plot schedule``'s schedule (as a trainer builds it from the same flags) and title."""
    from attnlab.training.schedule import schedule_from_dict

    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.schedule != "noam" and args.factor != 1.0:
        raise UsageError(f"--factor is an option of --schedule noam, not {args.schedule}")
    schedule = schedule_from_dict(schedule_from_args(args, args.d_model, args.factor))
    if args.schedule == "noam":
        return schedule, (f"lr = {schedule.factor:.4g} · {args.d_model}^-0.5 · "
                          f"min(step^-0.5, step · {schedule.warmup}^-1.5)")
    return schedule, (f"{args.schedule}: peak {schedule.peak_lr:.3g}, warmup {args.warmup} "
                      f"of {args.steps} steps")


def _plot_lens(args: argparse.Namespace, out: Path) -> None:
    """``plot lens``: the logit lens (attnlab/explain/lens.py) as a heatmap."""
    from attnlab import viz
    from attnlab.errors import BadInput
    from attnlab.explain.lens import logit_lens
    from attnlab.explain.probe import sentence_probe
    from attnlab.explain.subject import load_subject_model
    from attnlab.explain.tables import label

    model, tok, name, source, tgt_tok = load_subject_model(args.model, [args.sentence],
                                                           args.seed)
    try:
        probe = sentence_probe(model, tok, args.sentence, None, tgt_tok)
    except BadInput as e:
        raise UsageError(f"plot lens: {e}") from None
    announce(args, source, *runs_on(model))
    lens = logit_lens(probe)
    cells = [[label(probe.token_text(int(i))) for i in row[:, 0]] for row in lens.top_ids]
    viz.plot_lens(lens.final_probs, cells, lens.layers,
                  [label(probe.tokens[p]) for p in probe.read], out,
                  title=f"logit lens: {name}\ncolour: p(final prediction); text: top token")


def add_commands(sub) -> None:
    pl = sub.add_parser("plot", help="PNG pictures: attention grid, a ViT's attention "
                                     "rollout, cross-attention, positional encoding, "
                                     "learning-rate schedule",
                        description="Draw a picture as a PNG file.")
    pl.add_argument("what", choices=["attention", "cross", "lens", "positional", "schedule"],
                    help="attention: every head's map for a sentence, or with --image a "
                         "ViT's [CLS] attention rollout over the image; lens: the logit lens, "
                         "layer × position")
    pl.add_argument("sentence", nargs="?",
                    help="attention, cross: the sentence to run through the model (required)")
    add_model_arg(pl, "attention: minilm, a HF BERT folder or a run, with --image a ViT run or "
                      "HF ViT folder (default: a freshly initialised tiny model, or vit-tiny, "
                      "random weights); cross: a translation run or checkpoint (required)",
                  required=False, adapter=False)
    pl.add_argument("--image", metavar="SPEC",
                    help="attention: an image instead of a sentence: digits:N (image N of the "
                         "digits test split), or a .npy or PNG file of the model's shape")
    pl.add_argument("--layer", type=int, help="attention: only this layer's heads")
    pl.add_argument("--head", type=int,
                    help="attention, with --layer: only this head, labelled and with its "
                         "weights written in")
    add_out_arg(pl, "the PNG file to write", required=True)
    pl.add_argument("--d-model", type=int, default=512, help="positional, schedule: d_model")
    pl.add_argument("--max-len", type=int, default=100, help="positional: positions to draw")
    pl.add_argument("--schedule", choices=SCHEDULE_NAMES, default="noam",
                    help="schedule: which (as train --schedule)")
    pl.add_argument("--warmup", type=int, default=4000, help="schedule: warmup steps")
    pl.add_argument("--lr", type=float,
                    help="schedule: the peak learning rate (default: noam's peak with "
                         "--factor)")
    pl.add_argument("--factor", type=float, default=1.0, help="schedule: noam's factor")
    pl.add_argument("--min-lr", type=float, help="schedule: cosine's last rate (default 0)")
    pl.add_argument("--lr-end", type=float,
                    help="schedule: polynomial's last rate (default 1e-7)")
    pl.add_argument("--power", type=float, help="schedule: polynomial's power (default 1)")
    pl.add_argument("--steps", type=int, default=20000,
                    help="schedule: steps to draw, the schedule's length")
    pl.add_argument("--seed", type=int, default=0, help="attention: seed of the tiny model "
                                                          "(or vit-tiny)")
    add_quiet_arg(pl)
    pl.set_defaults(func=cmd_plot)
