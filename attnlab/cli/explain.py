"""``attnlab explain``: one sentence (or, with ``--image``, one image through a ViT) through
the pipeline, checked as it goes.

What the command runs is what the user asked for: it needs a sentence (none is made up), a
model is announced on stderr before it runs (a freshly initialised tiny one, when no
``--model`` is given, is announced as random), and input it would ignore (a sentence for
``explain --backward``) is refused. ``attnlab plot`` (cli/plot.py) draws the same runs as PNG
pictures and shares the model loading here.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli.common import UsageError, add_model_arg, add_quiet_arg, announce
from attnlab.errors import AttnlabError

if TYPE_CHECKING:  # the CLI imports torch only when a command needs it
    import torch

class CheckFailed(AttnlabError):
    """A stage recomputed by hand disagreed with the model's own forward pass."""


def cmd_explain(args: argparse.Namespace) -> None:
    from attnlab.explain.report import format_backward, format_text

    if args.backward:
        given = [name for name, value in (("sentence", args.sentence), ("--model", args.model),
                                          ("--image", args.image), ("--compare", args.compare),
                                          ("--word", args.word), ("--html", args.html))
                 if value]
        if given:
            raise UsageError(f"--backward takes no {', '.join(given)}: it checks one head's "
                             "gradients on fixed random numbers, not a model")
        print(format_backward(dims=args.dims))
        return
    if args.image:
        _explain_image(args)
        return
    if not args.sentence:
        raise UsageError("give a sentence to explain (or --image, or --backward)")
    if args.word and not args.compare:
        raise UsageError("--word names the word --compare compares; give --compare SENTENCE")
    if args.html:
        check_can_write(args.html, "--html")
    from attnlab.explain.subject import make_subject
    from attnlab.explain.walkthrough import compare_word, walk

    sentences = [args.sentence] + ([args.compare] if args.compare else [])
    model, tok, label = encoder_for(args, sentences)
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


def _explain_image(args: argparse.Namespace) -> None:
    """``explain --image``: the patch embedding, one layer and head, and the prediction of a
    ViT, each stage checked against the model's own pass."""
    given = [name for name, value in (("sentence", args.sentence), ("--compare", args.compare),
                                      ("--word", args.word)) if value]
    if given:
        raise UsageError(f"--image takes no {', '.join(given)}: it follows one image, not "
                         "a sentence")
    if args.html:
        check_can_write(args.html, "--html")
    from attnlab.explain.image import make_image_subject, walk_image
    from attnlab.explain.report import format_text

    model, image, name, label = vision_for(args, "explain --image")
    w = walk_image(make_image_subject(model, image, name, label), args.layer, args.head)
    print(format_text(w, args.dims))
    if args.html:
        from attnlab.explain.html import write_html

        print(f"\nHTML page: {write_html(w, args.html, dims=args.dims)}")
    if not all(c.ok for c in w.checks):
        raise CheckFailed("a check failed (see above)")


def vision_for(args: argparse.Namespace, command: str):
    """``(model, image (1, C, H, W), image name, model label)`` for ``--image``: the ViT
    ``--model`` names (any other model is refused), else a freshly initialised vit-tiny
    (random weights, ``--seed``); the image read at the model's shape; announced on stderr
    once both are known good."""
    from attnlab.data.images import read_image
    from attnlab.explain.image import load_image_model

    model, label, source = load_image_model(args.model, args.seed, command)
    c = model.config
    image, name = read_image(args.image, c.num_channels, c.image_size)
    announce(args, source, *runs_on(model))
    return model, image, name, label


def encoder_for(args: argparse.Namespace, sentences: list[str]):
    """``(model, tokenizer, label)`` of the encoder to follow, announced on stderr: the one
    ``--model`` names, else a freshly initialised tiny model (random weights, ``--seed``)
    whose word vocabulary is ``sentences``."""
    from attnlab.explain.subject import load_subject_model

    model, tok, label, source = load_subject_model(args.model, sentences, args.seed)
    announce(args, source, *runs_on(model))
    return model, tok, label


def runs_on(model) -> tuple[torch.device, str]:
    """``(device, precision)`` the model's weights are on and in: what its forward pass uses
    (these commands use no autocast)."""
    from attnlab.hardware import DTYPES

    weight = next(model.parameters())
    names = {dtype: name for name, dtype in DTYPES.items()}
    return weight.device, names.get(weight.dtype, str(weight.dtype))


def check_can_write(path: str | Path, flag: str) -> None:
    """Refuse, before any model runs, a file that cannot be written because its folder is
    missing, is not a folder or is not writable (the error would otherwise come after the
    line announcing the model, and after the work)."""
    folder = Path(path).absolute().parent
    if not folder.exists():
        raise UsageError(f"{flag} {path}: {folder} does not exist")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: {folder} is not writable")


def add_commands(sub) -> None:
    ex = sub.add_parser(
        "explain", help="follow one sentence through a layer, checked as it goes",
        description="Print every stage (tokens, ids, embeddings, positions, Q/K/V, scores, "
                    "scaling, mask, softmax, weighted sum, heads, W_O, residual + norm, "
                    "feed-forward) for one layer and head, with computed checks: an encoder's, "
                    "or a decoder's (causal; a sliding window's band). With --image, "
                    "a ViT's: patches, their projection, [CLS], positions, the layer, the "
                    "prediction.")
    ex.add_argument("sentence", nargs="?", help="the sentence to follow")
    add_model_arg(ex, "minilm, a HF folder or an attnlab run (with a tokenizer); with --image "
                      "a ViT run or HF ViT folder (default: a freshly initialised tiny model, "
                      "or vit-tiny, random weights)", required=False, adapter=False)
    ex.add_argument("--image", metavar="SPEC",
                    help="follow an image through a ViT instead: digits:N (image N of the "
                         "digits test split), or a .npy or PNG file of the model's shape")
    ex.add_argument("--layer", type=int, default=0)
    ex.add_argument("--head", type=int, default=0)
    ex.add_argument("--dims", type=int, default=6, help="columns of each matrix to print")
    ex.add_argument("--compare", metavar="SENTENCE",
                    help="a second sentence: contextual vs static vectors of a shared word")
    ex.add_argument("--word", help="the shared word to compare (default: the longest)")
    ex.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    ex.add_argument("--backward", action="store_true",
                    help="print one head's gradients by the formulas, checked against autograd "
                         "(on fixed random numbers: no sentence, no model)")
    ex.add_argument("--seed", type=int, default=0, help="seed of the tiny model (or vit-tiny)")
    add_quiet_arg(ex)
    ex.set_defaults(func=cmd_explain)
