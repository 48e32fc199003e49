"""``attnlab evaluate ner | classify | qa``: a fine-tuned encoder scored on labelled data by its
task's own scores (attnlab/tasks/): entities as CoNLL-2003 counts them, a classifier's report
and confusion matrix as scikit-learn computes them, SQuAD's exact match and F1; and
``evaluate choice`` on an encoder with a multiple-choice head, its accuracy."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from attnlab.cli.common import UsageError, add_model_arg, add_runtime_args, announce, runtime


def _task_encoder(args: argparse.Namespace, head: str, trained_by: str):
    """``(encoder, device, precision)``: the ``--model`` encoder, which must have ``head``
    (the one ``trained_by`` gives), on ``--device``, announced."""
    from attnlab.errors import UnsupportedFormat
    from attnlab.sentence_encoder import load_encoder

    device, precision = runtime(args)
    enc = load_encoder(args.model, args.adapter)
    if enc.model.config.head != head:
        raise UnsupportedFormat(f"{enc.path}: model has head={enc.model.config.head!r}, not "
                                f"{head!r} (a run of 'attnlab {trained_by}')")
    enc.model.to(device)
    announce(args, enc.path, device, precision)
    return enc, device, precision


def cmd_evaluate_ner(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.tasks.ner import read_conll, score

    sentences = read_conll(args.data)
    enc, device, precision = _task_encoder(args, "tokens", "train ner")
    with hardware.autocast(device, precision):
        scores = score(enc.model, enc.tokenizer, sentences, args.batch)
    words = sum(len(s.words) for s in sentences)
    print(f"{len(sentences):,} sentences, {words:,} words, {scores.expected:,} entities")
    print(f"entity precision {scores.precision:.4f}, recall {scores.recall:.4f}, "
          f"F1 {scores.f1:.4f} ({scores.correct:,} of {scores.found:,} found are right)")
    for kind, (p, r, f, n) in scores.per_type.items():
        print(f"  {kind:<6} precision {p:.4f}, recall {r:.4f}, F1 {f:.4f} ({n:,} entities)")


SPLITS = ("train", "val", "test")  # split_by_hash's order


def _at_least_one(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got "
                             f"{getattr(args, name)}")


def cmd_evaluate_classify(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.tasks import classify

    _at_least_one(args, "batch")
    if args.plot:  # a folder that cannot be made fails now, not after the model has run
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    enc, device, precision = _task_encoder(args, "classify", "train classify")
    pair_field = args.pair_field or enc.model.config.extra.get("reading", {}).get("pair_field")
    examples = classify.read_labelled(args.data, args.text_field, args.label_field, args.id_field,
                                      pair_field)
    if args.split != "all":
        examples = classify.split_by_hash(examples)[SPLITS.index(args.split)]
        if not examples:
            raise UsageError(f"{args.data}: the {args.split} split holds no examples")
    labels = enc.labels or [str(i) for i in range(enc.model.config.num_labels)]
    unknown = sorted({e.label for e in examples} - set(labels))
    if unknown:  # the model cannot predict them: most likely the wrong file or --label-field
        raise UsageError(f"{args.data}: label(s) {', '.join(map(repr, unknown[:5]))} of "
                         f"--label-field {args.label_field} are not among the model's {labels}")
    with hardware.autocast(device, precision):
        probs = classify.classify_examples(enc, examples, args.batch)
    report = classify.classification_report([labels.index(e.label) for e in examples],
                                            probs.argmax(-1).tolist(), labels)
    split = "" if args.split == "all" else f", the {args.split} split"
    print(f"{args.data}{split}: {report.total:,} examples, {len(labels)} classes")
    for line in classify.format_report(report):
        print(line)
    if args.plot:
        from attnlab.viz import plot_confusion_matrix

        plot_confusion_matrix(report.confusion, labels, args.plot)
        print(f"confusion matrix in {args.plot}")


def cmd_evaluate_qa(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.tasks.qa import read_squad, reading_window, score_questions
    from attnlab.tasks.qa.recipe import article_range

    _at_least_one(args, "batch", "max_answer_len")
    articles = article_range(args.articles) if args.articles else None
    questions = read_squad(args.data, articles)
    enc, device, precision = _task_encoder(args, "qa", "train qa")
    max_len, stride = reading_window(enc)  # the windows the run trained on
    with hardware.autocast(device, precision):
        em, f1, _ = score_questions(enc.model, enc.tokenizer, questions, max_len, stride,
                                    args.max_answer_len, args.batch)
    which = f" of articles {args.articles}" if articles else ""
    print(f"{args.data}: {len(questions):,} questions{which}; windows of {max_len} tokens, "
          f"stride {stride}")
    print(f"exact match {em:.2f}, F1 {f1:.2f}")


def names_an_encoder(spec: str) -> bool:
    """Whether ``--model`` is an encoder, from its config alone (no weights read): how
    ``evaluate choice`` tells a multiple-choice head from a language model. Whatever cannot
    be told so is left to the language model's path, which names the problem."""
    from attnlab.files import read_json
    from attnlab.interop.huggingface import checked_token_ids, family_of
    from attnlab.storage import ALIASES, read_config, resolve_model_dir

    path = ALIASES[spec]() if spec in ALIASES else Path(spec)
    if not path.is_dir():
        return False
    if (path / "config.json").exists():
        hf = read_json(path / "config.json")
        if isinstance(hf, dict) and "model_type" in hf:  # a Hugging Face folder
            return family_of(hf, path).to_config(checked_token_ids(hf)).arch == "encoder"
    with warnings.catch_warnings():  # which checkpoint it runs: said once, when it loads
        warnings.simplefilter("ignore")
        return read_config(resolve_model_dir(path)).arch == "encoder"


def cmd_evaluate_choice_head(args: argparse.Namespace, examples) -> None:
    """``evaluate choice`` on an encoder with a multiple-choice head (``train choice``): each
    question read alone, its choice with the largest logit; the accuracy."""
    from attnlab import hardware
    from attnlab.tasks.choice import mean_stderr
    from attnlab.tasks.choice.head import decisions, reading, score_questions

    if args.shots:
        raise UsageError("--shots: demonstrations are for language models; a multiple-choice "
                         "head reads each question alone")
    if args.int4 or args.int8:
        raise UsageError("--int4/--int8 are for language models, not a multiple-choice head")
    enc, device, precision = _task_encoder(args, "choice", "train choice")
    examples = examples[: args.limit]
    max_len, truncation = reading(enc.model, enc.max_len)
    with hardware.autocast(device, precision):
        scores = score_questions(enc.model, enc.tokenizer, examples, max_len, truncation,
                                 args.batch)
    chosen = decisions(scores)
    acc, stderr = mean_stderr([float(p == e.answer) for p, e in zip(chosen, examples,
                                                                    strict=True)])
    if args.json:
        print(json.dumps({"acc": acc, "acc_stderr": stderr, "examples": len(examples),
                          "lines": [e.line for e in examples],
                          "answers": [e.answer for e in examples], "logits": scores,
                          "decisions": chosen}))
        return
    shown = f"{acc:.4f}" if stderr is None else f"{acc:.4f} ± {stderr:.4f}"
    print(f"acc {shown}  ({len(examples)} examples, a multiple-choice head; pairs cut "
          f"{truncation} to {max_len} tokens)")


def add_task_commands(kinds) -> None:
    """The task commands, added to ``attnlab evaluate``'s subcommands ``kinds``."""
    ne = kinds.add_parser("ner", help="entity-level precision, recall and F1 on a CoNLL file",
                          description="Tag every sentence of a CoNLL file and score the "
                                      "entities as CoNLL-2003 (conlleval, seqeval) do: a "
                                      "found entity counts when its type and both ends match.")
    add_model_arg(ne, "a run folder from 'attnlab train ner'")
    ne.add_argument("--data", required=True, metavar="FILE", help="a CoNLL file (test.txt)")
    ne.add_argument("--batch", type=int, default=32, help="sentences per batch")
    add_runtime_args(ne)
    ne.set_defaults(func=cmd_evaluate_ner)

    cl = kinds.add_parser(
        "classify", help="a classifier's accuracy, P/R/F1 and confusion matrix on labelled data",
        description="Classify every example of labelled JSON lines (as 'attnlab classify' does) "
                    "and print accuracy; macro, micro and weighted precision, recall and F1; "
                    "each class's precision, recall, F1 and support; and the confusion matrix "
                    "(scikit-learn's classification_report and confusion_matrix over all the "
                    "model's classes).")
    add_model_arg(cl, "a run folder from 'attnlab train classify'")
    cl.add_argument("--data", required=True, metavar="FILE", help="a .jsonl or .jsonl.gz file")
    cl.add_argument("--text-field", required=True, help="field with the text (or F1,F2)")
    cl.add_argument("--label-field", required=True, help="field with the label")
    cl.add_argument("--id-field", default="id", help="field hashed for --split")
    cl.add_argument("--pair-field", metavar="FIELD",
                    help="the second text of each pair (default: the run's)")
    cl.add_argument("--split", choices=["all", *SPLITS], default="all",
                    help="score only this part of train classify's fixed 80/10/10 split")
    cl.add_argument("--plot", metavar="FILE.png", help="also draw the confusion matrix")
    cl.add_argument("--batch", type=int, default=32, help="texts per batch")
    add_runtime_args(cl)
    cl.set_defaults(func=cmd_evaluate_classify)

    qa = kinds.add_parser("qa", help="SQuAD's exact match and F1 of a question-answering run",
                          description="Answer every question of a SQuAD-format file (windows "
                                      "as the run trained with) and print SQuAD v1.1's exact "
                                      "match and F1, best over each question's answers.")
    add_model_arg(qa, "a run folder from 'attnlab train qa'")
    qa.add_argument("--data", required=True, metavar="FILE", help="SQuAD JSON (plain or .gz)")
    qa.add_argument("--articles", metavar="FIRST-LAST",
                    help="only these articles (as train qa's --eval-articles); default all")
    qa.add_argument("--max-answer-len", type=int, default=30, help="longest answer, in tokens")
    qa.add_argument("--batch", type=int, default=16, help="windows per batch")
    add_runtime_args(qa)
    qa.set_defaults(func=cmd_evaluate_qa)
