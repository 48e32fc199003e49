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

    from attnlab.explain.subject import SubjectModel

class CheckFailed(AttnlabError):
    """A stage recomputed by hand disagreed with the model's own forward pass."""


def cmd_explain(args: argparse.Namespace) -> None:
    from attnlab.explain.report import format_backward, format_text

    if args.serve:
        _serve(args)
        return
    served = [flag for flag, value in (("--host", args.host != "127.0.0.1"),
                                       ("--port", args.port != 8000),
                                       ("--max-tokens", args.max_tokens != 128),
                                       ("--api-key", args.api_key)) if value]
    if served:
        raise UsageError(f"{served[0]} is for --serve")
    if args.examples or args.example:
        _explain_examples(args)
        return
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
    if _probes(args):
        _explain_probes(args)
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
    from attnlab.explain.seq2seq import check_options, walk_sentence
    from attnlab.explain.subject import make_subject
    from attnlab.explain.walkthrough import compare_word

    choice = _choice(args)
    sentences = [args.sentence] + ([args.compare] if args.compare else [])
    m = encoder_for(args, sentences)
    subject = make_subject(m.model, m.tokenizer, args.sentence, m.label)
    check_options(subject, args.target, args.steps, choice)  # before the model runs
    w, translation = walk_sentence(subject, args.layer, args.head, args.target, args.steps,
                                   choice, m.target_tokenizer)
    compared = None
    if args.compare:
        other = make_subject(m.model, m.tokenizer, args.compare, m.label)
        compared = compare_word(subject, other, args.word)
    print(format_text(w, args.dims, compared, translation))
    if args.html:
        from attnlab.explain.html import write_html

        page = write_html(w, args.html, compared, args.dims, translation, args.target,
                          m.target_tokenizer)
        print(f"\nHTML page: {page}")
    if not all(c.ok for c in w.checks):
        raise CheckFailed("a check failed (see above)")


def _serve(args: argparse.Namespace) -> None:
    """``--serve``: the live page (attnlab/explain/live/) for ``--model`` on
    ``--host:--port``, showing the sentence (and ``--target``, or ``--image``) first; the page
    does the rest (the layer, head and sampling are picked there), so the other modes' flags
    are refused."""
    given = [name for name, value in (
        ("--html", args.html), ("--compare", args.compare), ("--steps", args.steps),
        ("--backward", args.backward), ("--examples", args.examples),
        ("--example", args.example), ("--word", args.word), ("--layer", args.layer),
        ("--head", args.head), ("--temperature", args.temperature), ("--top-k", args.top_k),
        ("--top-p", args.top_p), ("--sample-seed", args.sample_seed),
        ("--dims", args.dims != 6), *((flag, True) for flag in _probes(args))) if value]
    if given:
        raise UsageError(f"--serve runs the page, which does what {', '.join(given)} would: "
                         "drop them")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    api_key = args.api_key or os.environ.get("ATTNLAB_API_KEY") or None
    from attnlab.cli.http import graceful_server, listen, loopback

    if api_key is None and not loopback(args.host):
        raise UsageError(f"--host {args.host} lets other machines in: give --api-key (the page "
                         "asks for it once)")
    try:
        import uvicorn

        from attnlab.explain.live.app import create_app
    except ImportError as e:
        raise UsageError(f"explain --serve needs {e.name}: pip install 'attnlab[serve]'") from None
    from attnlab.errors import BadInput
    from attnlab.explain.live.session import Session

    sock = listen(args.host, args.port)  # before loading: a busy port fails fast
    try:
        session = Session(args.model, args.seed, args.max_tokens, args.image, args.sentence,
                          args.target)
    except BadInput as e:
        raise UsageError(str(e)) from None
    announce(args, session.source, session.device, session.precision)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"attnlab explain: open http://{shown}:{port}/ in a browser (Ctrl-C stops)",
          flush=True)
    app = create_app(session, api_key, local_only=loopback(args.host))
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    graceful_server(config).run(sockets=[sock])


def _choice(args: argparse.Namespace):
    """The output stage's choice of the next token (--temperature, --top-k, --top-p,
    --sample-seed), refused with the flag's name where generate would refuse it."""
    from attnlab.errors import BadInput
    from attnlab.explain.output import Choice

    try:
        return Choice(args.temperature, args.top_k, args.top_p, args.sample_seed)
    except BadInput as e:
        name, rest = str(e).split(" ", 1)
        raise UsageError(f"--{name.replace('_', '-')} {rest}") from None


def _probes(args: argparse.Namespace) -> list[str]:
    """The flags that read the model's own run layer by layer or change it head by head."""
    return [flag for flag, on in (("--lens", args.lens), ("--all-layers", args.all_layers),
                                  ("--ablate", args.ablate), ("--patch-from", args.patch_from))
            if on]


def _explain_probes(args: argparse.Namespace) -> None:
    """``--lens``, ``--all-layers``, ``--ablate``, ``--patch-from`` (attnlab/explain/lens.py,
    interventions.py): the input and the heads are checked before the model is announced."""
    from attnlab.errors import BadInput
    from attnlab.explain.interventions import check_same_length, parse_heads, probe_report
    from attnlab.explain.probe import image_probe, sentence_probe

    flags = _probes(args)
    given = [name for name, value in (("--compare", args.compare), ("--word", args.word),
                                      ("--steps", args.steps)) if value]
    if given:
        raise UsageError(f"{flags[0]} prints its own tables: drop {', '.join(given)}")
    if args.image and (args.patch_from or args.target):
        raise UsageError(f"--image takes no {'--patch-from' if args.patch_from else '--target'}")
    if not args.sentence and not args.image:
        raise UsageError(f"{flags[0]} needs a sentence (or --image)")
    if args.html:  # the page the plain explain writes, while the flags print their tables
        check_can_write(args.html, "--html")
        choice = _choice(args)
    try:
        if args.image:
            model, image, name, label = vision_for(args, f"explain {flags[0]}")
            probe, other, tgt_tok = image_probe(model, image), None, None
        else:
            from attnlab.explain.subject import load_subject_model

            texts = [args.sentence] + ([args.patch_from] if args.patch_from else [])
            model, tok, label, source, tgt_tok = load_subject_model(args.model, texts, args.seed)
            probe = sentence_probe(model, tok, args.sentence, args.target, tgt_tok)
            other = (sentence_probe(model, tok, args.patch_from, args.target, tgt_tok)
                     if args.patch_from else None)
        heads = parse_heads(args.ablate, probe) if args.ablate else None
        if other is not None:
            check_same_length(probe, other)
    except BadInput as e:
        raise UsageError(str(e) if str(e).startswith("--") else f"{flags[0]}: {e}") from None
    if not args.image:
        announce(args, source, *runs_on(model))
    if args.html:  # first: a layer or head the walk lacks is refused before any table
        w, page = _page(args, model, label, choice, image if args.image else tok, tgt_tok,
                        name if args.image else None)
    text, checks = probe_report(probe, args.lens, heads, other, args.all_layers)
    print(text)
    if args.html:
        print(f"\nHTML page: {page} (its walkthrough: {sum(c.ok for c in w.checks)} of "
              f"{len(w.checks)} checks passed)")
        checks += w.checks
    if not all(c.ok for c in checks):
        raise CheckFailed("a check failed (see above)")


def _page(args: argparse.Namespace, model, label: str, choice, reads, tgt_tok, name=None):
    """``--html`` with a probe flag: the walk the plain ``explain`` prints, written to the
    page only (attnlab/explain/html.py: the views, the output, the lens and the ablations).
    ``reads``: the tokenizer, or with ``--image`` the image (named ``name``)."""
    from attnlab.explain.html import write_html

    if args.image:
        from attnlab.explain.image import make_image_subject, walk_image

        w = walk_image(make_image_subject(model, reads, name, label), args.layer, args.head)
        translation = None
    else:
        from attnlab.explain.seq2seq import walk_sentence
        from attnlab.explain.subject import make_subject

        w, translation = walk_sentence(make_subject(model, reads, args.sentence, label),
                                       args.layer, args.head, args.target, None, choice, tgt_tok)
    return w, write_html(w, args.html, None, args.dims, translation, args.target, tgt_tok)


def _explain_examples(args: argparse.Namespace) -> None:
    """``--examples`` (the list) or ``--example NAME`` (one, recomputed); neither runs a model,
    so a sentence or a model given with them is refused."""
    flag = "--examples" if args.examples else "--example"
    given = [name for name, value in (("sentence", args.sentence), ("--model", args.model),
                                      ("--image", args.image), ("--compare", args.compare),
                                      ("--html", args.html), ("--backward", args.backward))
             if value]
    if args.examples and args.example:
        given.append("--example")
    if given:
        raise UsageError(f"{flag} takes no {', '.join(given)}: the worked examples recompute "
                         "the course's own numbers, not a model")
    from attnlab.explain.examples import format_example, format_list, list_examples, run_example

    if args.examples:
        print(format_list(list_examples()))
        return
    result = run_example(args.example)
    print(format_example(result))
    if not all(c.ok for c in result.checks):
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


def encoder_for(args: argparse.Namespace, sentences: list[str]) -> SubjectModel:
    """The model to follow, announced on stderr: the one ``--model`` names, else a freshly
    initialised tiny model (random weights, ``--seed``) whose word vocabulary is
    ``sentences``."""
    from attnlab.explain.subject import load_subject_model

    m = load_subject_model(args.model, sentences, args.seed)
    announce(args, m.source, *runs_on(m.model))
    return m


def runs_on(model) -> tuple[torch.device, str]:
    """``(device, precision)`` the model's weights are on and in: what its forward pass uses
    (these commands use no autocast)."""
    from attnlab.hardware import weights_on

    return weights_on(model)


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
                    "or a decoder's (causal; a sliding window's band). An encoder–decoder "
                    "continues through its decoder (masked self-attention, cross-attention), "
                    "the output stage and the translation, one token a step; a decoder-only "
                    "model and a masked LM at [MASK] end with the output stage. With --image, "
                    "a ViT's: patches, their projection, [CLS], positions, the layer, the "
                    "prediction.")
    ex.add_argument("sentence", nargs="?", help="the sentence to follow")
    add_model_arg(ex, "minilm, a HF folder or an attnlab run (with a tokenizer); with --image "
                      "a ViT run or HF ViT folder (default: a freshly initialised tiny model, "
                      "or vit-tiny, random weights)", required=False, adapter=False)
    ex.add_argument("--image", metavar="SPEC",
                    help="follow an image through a ViT instead: digits:N (image N of the "
                         "digits test split), or a .npy or PNG file of the model's shape")
    ex.add_argument("--layer", type=int, default=0,
                    help="the layer to follow (an encoder–decoder: in the encoder and in the "
                         "decoder)")
    ex.add_argument("--head", type=int, default=0,
                    help="the head to follow (an encoder–decoder: in both stacks, and in the "
                         "decoder's cross-attention)")
    ex.add_argument("--target", metavar="PREFIX",
                    help="an encoder–decoder: the target prefix the decoder reads after the "
                         "start token (default: the start token alone); it also runs in one "
                         "pass (teacher forcing), checked against decoding it step by step")
    ex.add_argument("--steps", type=int, metavar="N",
                    help="an encoder–decoder: tokens to generate after the prefix, one a "
                         "step with the KV cache (default: to the end token or the length "
                         "limit, as translate does)")
    ex.add_argument("--temperature", type=float, default=0.0,
                    help="the output stage: sample from softmax(logits / T) (0: greedy)")
    ex.add_argument("--top-k", type=int, help="sampling: keep the k most likely tokens")
    ex.add_argument("--top-p", type=float,
                    help="sampling: keep the smallest set of tokens whose probability reaches p")
    ex.add_argument("--sample-seed", type=int,
                    help="seed of the sampling generator (default 0; --seed is the tiny "
                         "model's)")
    ex.add_argument("--dims", type=int, default=6, help="columns of each matrix to print")
    ex.add_argument("--compare", metavar="SENTENCE",
                    help="a second sentence: contextual vs static vectors of a shared word")
    ex.add_argument("--word", help="the shared word to compare (default: the longest)")
    ex.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    ex.add_argument("--lens", action="store_true",
                    help="the logit lens: every layer's output through the model's final norm "
                         "and output layer, top tokens by layer and position (BERT: at [MASK])")
    ex.add_argument("--all-layers", action="store_true",
                    help="the residual stream layer by layer at the last position: the update's "
                         "norm, what the lens reads, the head that moved it most")
    ex.add_argument("--ablate", metavar="L.H[,L.H...]",
                    help="zero these heads' outputs (layer.head; an encoder-decoder also takes "
                         "encoder.L.H, decoder.L.H, cross.L.H) and show what changes")
    ex.add_argument("--patch-from", metavar="SENTENCE",
                    help="activation patching: each head's output from this sentence's run (the "
                         "same token count), one head at a time; the logit difference restored")
    ex.add_argument("--backward", action="store_true",
                    help="print one head's gradients by the formulas, checked against autograd "
                         "(on fixed random numbers: no sentence, no model)")
    ex.add_argument("--examples", action="store_true",
                    help="list the course's worked examples, each with its course file and "
                         "section")
    ex.add_argument("--example", metavar="NAME",
                    help="recompute one worked example from the inputs its course text states, "
                         "every intermediate shown, where the text's printed values differ and "
                         "why, and checks against torch (no sentence, no model)")
    ex.add_argument("--serve", action="store_true",
                    help="a live page in the browser: type a sentence, move the temperature, "
                         "pick a layer and head, switch a head off (with --image: a ViT and "
                         "its digit)")
    ex.add_argument("--host", default="127.0.0.1",
                    help="--serve: the address to listen on (another than this machine's "
                         "needs --api-key)")
    ex.add_argument("--port", type=int, default=8000, help="--serve: the port (0: any free one)")
    ex.add_argument("--max-tokens", type=int, default=128,
                    help="--serve: the most tokens a sentence may have")
    ex.add_argument("--api-key", help="--serve: require it on every request (default: "
                                      "$ATTNLAB_API_KEY, else none)")
    ex.add_argument("--seed", type=int, default=0, help="seed of the tiny model (or vit-tiny)")
    add_quiet_arg(ex)
    ex.set_defaults(func=cmd_explain)
