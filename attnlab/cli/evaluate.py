"""``attnlab evaluate``: one command group for every way attnlab scores something.

* ``evaluate translate``: a translation model on a test set: it translates ``--src`` and scores
  against ``--ref`` (sacreBLEU's BLEU and chrF, ROUGE), with the decoding speed;
* ``evaluate text``: any hypothesis file against a reference file, one example a line;
* ``evaluate choice``: a language model on multiple-choice questions (a JSON-lines file),
  zero- or few-shot, scored as EleutherAI's lm-evaluation-harness scores them: the
  log-likelihood of each choice after the prompt, ``acc`` and ``acc_norm``
  (:mod:`attnlab.tasks.choice`, :mod:`attnlab.generation.likelihood`); or an encoder with a
  multiple-choice head, its ``acc`` (:mod:`attnlab.tasks.choice.head`);
* ``evaluate lm``: a language model's perplexity on a text file, read through a sliding window;
* ``evaluate classify|ner|qa``: a fine-tuned encoder on labelled data, scored by its task
  (:mod:`attnlab.tasks`): a classifier's report, entity F1, SQuAD's EM and F1.

The flat form of an earlier release, ``attnlab evaluate --model M --src S --ref R``, still runs
``evaluate translate``, after a one-line deprecation note (``cli.LEGACY``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli.common import (
    UsageError,
    add_compile_arg,
    add_integer_args,
    add_model_arg,
    add_out_arg,
    add_runtime_args,
    add_sampling_args,
    announce,
    compiled_step,
    decoding_runtime,
    integer_bits,
    integer_label,
    load_for,
    sampling_seed,
    translation_beam,
    warn_unknown,
)
from attnlab.cli.evaluate_tasks import (
    add_task_commands,
    cmd_evaluate_choice_head,
    names_an_encoder,
)

if TYPE_CHECKING:  # the CLI imports torch only when a command needs it
    import torch

    from attnlab.storage import Loaded
    from attnlab.tasks.choice import Example


def _examples(path: str) -> list[str]:
    """One example a line (plain or .gz); the two characters ``\\n`` inside a line separate
    the example's sentences (what ROUGE-Lsum splits on)."""
    from attnlab.files import read_lines

    return [line.replace("\\n", "\n") for line in read_lines(path)]


def _aligned(hyp_path: str, ref_path: str, hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise UsageError(f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}")


def cmd_evaluate_translate(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.generation.seq2seq import translate
    from attnlab.metrics import text_scores

    beam = translation_beam(args, default=4)  # (sampling flags: 1)
    loaded, device, precision = load_for(args, "encoder-decoder")
    src, ref = _examples(args.src), _examples(args.ref)  # the test corpus, as it is
    _aligned(args.src, args.ref, src, ref)
    if args.out:  # a folder that cannot be made fails now, not after decoding
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    announce(args, loaded.path, device, precision)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    target = loaded.tokenizers["target"]
    generator, search = None, "greedy" if beam == 1 else f"beam {beam}, alpha {args.alpha}"
    if args.temperature > 0:  # as generate: a fresh seed is printed, --seed repeats a run
        import torch

        generator = torch.Generator(device=device).manual_seed(sampling_seed(args))
        search = f"sampled at temperature {args.temperature:g}" + "".join(
            f", {name} {value:g}" for name, value in (("top-k", args.top_k),
                                                      ("top-p", args.top_p)) if value)
    start = time.perf_counter()
    with hardware.autocast(device, precision):
        hyps = translate(loaded.model, loaded.tokenizers["source"], target, src,
                         batch_size=args.batch, beam_size=beam, alpha=args.alpha,
                         compiled=compiled_step(args, encoder_decoder=True),
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                         generator=generator)
    seconds = time.perf_counter() - start
    n_tokens = sum(len(target.encode(h)) + 1 for h in hyps)  # + eos
    for line in text_scores(hyps, ref, args.lang):
        print(line)
    print(f"decoding: {len(src)} sentences in {seconds:.1f} s: {len(src) / seconds:.1f} "
          f"sentences/s, {n_tokens / seconds:.0f} tokens/s "
          f"({search}; "
          f"{precision} on {device})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(h.replace("\n", "\\n") + "\n" for h in hyps)


def cmd_evaluate_text(args: argparse.Namespace) -> None:
    from attnlab.metrics import text_scores

    hyps, refs = _examples(args.hyp), _examples(args.ref)
    _aligned(args.hyp, args.ref, hyps, refs)
    if not hyps:
        raise UsageError(f"{args.hyp} holds no examples")
    for line in text_scores(hyps, refs, args.lang):
        print(line)


def _demos(args: argparse.Namespace, examples: list[Example]) -> list[list[Example]]:
    """Each scored example's demonstrations (module docstring of attnlab.tasks.choice); too
    few to draw from is one error naming --shots, the line and the numbers."""
    from attnlab.tasks import choice

    pool = choice.DemoPool(choice.read_examples(args.pool) if args.pool else examples,
                           is_data=not args.pool)
    pool_name = args.pool or args.data
    seed = None if args.pool_order == "file" else args.seed
    chosen = []
    for position, example in enumerate(examples[: args.limit]):
        if args.shots == 0:
            chosen.append([])
            continue
        available = pool.available(example, position)
        if args.shots > available:
            copies = len(pool.excluded(example, position)) - pool.is_data  # less its own line
            raise UsageError(f"--shots {args.shots} is more than the {available} "
                             f"demonstrations available to {args.data}:{example.line} "
                             f"({len(pool)} examples in {pool_name}"
                             f"{', less the example itself' if pool.is_data else ''}"
                             f"{f', less {copies} with the same content' if copies else ''})")
        chosen.append([pool.examples[j]
                       for j in pool.draw(example, position, args.shots, seed)])
    return chosen


def _decoder(args: argparse.Namespace) -> tuple[Loaded, torch.device, str, str]:
    """``(loaded, device, precision, what the announce line says)``; ``--int4``/``--int8`` as
    ``generate`` runs them (CPU, bf16 kernels). A quantised folder's float parts take the
    precision asked (``auto``: bf16 where the CPU runs it natively), its integer layers keep
    theirs, and the line says both."""
    if not integer_bits(args):
        from attnlab.generation.pipeline import integer_weights
        from attnlab.nn.quantized import integer_parts

        loaded, device, precision = load_for(args, "decoder")  # (float parts: `precision`)
        if integer_parts(loaded.model) is None:
            return loaded, device, precision, precision
        return loaded, device, precision, integer_weights(*integer_parts(loaded.model))
    from attnlab.cpu import for_decoding
    from attnlab.storage import load

    device, _, _ = decoding_runtime(args)
    loaded = load(args.model, int4=args.int4, int8=args.int8,
                  adapter=args.adapter).expect("decoder", args.command)
    loaded.model = for_decoding(loaded.model, device, "bf16", integer=True)
    return loaded, device, "bf16", integer_label(integer_bits(args))


def _requests(args: argparse.Namespace, loaded: Loaded, examples: list[Example],
              demos: list[list[Example]]) -> list[list[tuple[list[int], list[int]]]]:
    """Each question's ``(context_ids, continuation_ids)`` per choice; symbols the vocabulary
    lacks are named in one warning, a choice longer than the model's context is an error, and
    prompts that will be cut are counted in one warning."""
    from attnlab.tasks import choice

    tok, window = loaded.tokenizer, loaded.config.context
    shown = dict.fromkeys([*examples, *(d for ds in demos for d in ds)])  # each text once
    delimiters = [choice.TARGET_DELIMITER, *([choice.FEWSHOT_DELIMITER] if args.shots or any(
        ex.instruction for ex in examples) else [])]
    warn_unknown(tok, [*delimiters, *(t for ex in shown
                                      for t in (ex.instruction or "", ex.context, *ex.choices))],
                 args.data + (f" and {args.pool}" if args.pool and args.shots else ""))
    requests = [choice.encode_choices(tok, choice.build_prompt(ex, d), ex,
                                      f"{args.data}:{ex.line}")
                for ex, d in zip(examples, demos, strict=True)]
    if window is None:  # ALiBi, no positions: nothing to cut
        return requests
    for ex, r in zip(examples, requests, strict=True):
        for i, (_, ids) in enumerate(r):
            if len(ids) > window:
                raise UsageError(f"{args.data}:{ex.line}: choice {i} is {len(ids)} tokens, more "
                                 f"than the model's context of {window}")
    cut = sum(any(len(x) + len(c) > window + 1 for x, c in r) for r in requests)
    if cut:
        warnings.warn(f"{cut} of {len(examples)} prompts are longer than the model's context "
                      f"of {window} tokens: their first tokens are left out, as "
                      "lm-evaluation-harness does", stacklevel=2)
    return requests


def cmd_evaluate_lm(args: argparse.Namespace) -> None:
    import math

    from attnlab import hardware
    from attnlab.files import read_text
    from attnlab.generation.likelihood import rolling_nll, windows

    text = read_text(args.text)
    loaded, device, precision, said = _decoder(args)
    window = loaded.config.context
    block = args.block or min(window or 1024, 1024)
    if window is not None and block > window:
        raise UsageError(f"--block {block} exceeds the model's context of {window} tokens")
    stride = args.stride or max(block // 2, 1)
    if block < 2 or not 1 <= stride < block:
        raise UsageError(f"need --block >= 2 and 1 <= --stride < --block, got --block {block}"
                         f" --stride {stride}")
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    tok = loaded.tokenizer
    warn_unknown(tok, [text], args.text)
    ids = tok.encode(text, add_bos=args.bos)
    if len(ids) < 2:
        raise UsageError(f"{args.text}: {len(ids)} token(s); perplexity needs at least 2")
    bits = integer_bits(args)
    announce(args, loaded.path, device, said)
    precise = contextlib.nullcontext() if bits else hardware.autocast(device, precision)
    start = time.perf_counter()
    with precise:
        nll, n = rolling_nll(loaded.model, ids, block, stride, args.batch)
    seconds = time.perf_counter() - start
    print(f"{args.text}: {len(text):,} characters, {len(ids):,} tokens"
          f"{' (BOS first)' if args.bos else ''}; {len(windows(len(ids), block, stride))} "
          f"windows of at most {block} tokens every {stride}")
    print(f"scored {n:,} tokens in {seconds:.1f} s ({n / max(seconds, 1e-9):,.0f} tokens/s)")
    print(f"negative log-likelihood: {nll / n:.4f} nats/token, "
          f"{nll / math.log(2) / len(text.encode()):.4f} bits/byte")
    print(f"perplexity: {math.exp(nll / n):.4f}")


def cmd_evaluate_choice(args: argparse.Namespace) -> None:
    from attnlab import hardware
    from attnlab.tasks import choice

    for flag, value, low in (("--shots", args.shots, 0), ("--batch", args.batch, 1),
                             ("--limit", args.limit, 1)):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    examples = choice.read_examples(args.data)
    if names_an_encoder(args.model):  # a multiple-choice head ('train choice'): its logits
        return cmd_evaluate_choice_head(args, examples)
    demos = _demos(args, examples)  # the data's errors before the model is loaded
    examples = examples[: args.limit]
    loaded, device, precision, said = _decoder(args)
    requests = _requests(args, loaded, examples, demos)
    bits = integer_bits(args)
    announce(args, loaded.path, device, said)
    precise = contextlib.nullcontext() if bits else hardware.autocast(device, precision)
    start = time.perf_counter()
    with precise:
        scores = choice.score_requests(loaded.model, requests, args.batch)
    seconds = time.perf_counter() - start
    judged = [choice.judge(ex, s) for ex, s in zip(examples, scores, strict=True)]
    acc = choice.mean_stderr([j.acc for j in judged])
    acc_norm = choice.mean_stderr([j.acc_norm for j in judged])
    if args.json:
        print(json.dumps({
            "acc": acc[0], "acc_stderr": acc[1], "acc_norm": acc_norm[0],
            "acc_norm_stderr": acc_norm[1], "examples": len(judged), "shots": args.shots,
            "pool_order": args.pool_order, "seed": args.seed, "batch": args.batch,
            "seconds": seconds, "lines": [ex.line for ex in examples],
            "answers": [j.answer for j in judged],
            "loglikelihoods": [list(j.scores) for j in judged],
            "decisions": [j.pred for j in judged],
            "decisions_norm": [j.pred_norm for j in judged],
            "lengths": [[len(c) for c in ex.choices] for ex in examples]}))
        return
    if args.shots == 0:
        how = "0-shot"
    elif args.pool_order == "file":
        how = f"{args.shots}-shot, the first {args.shots} of {args.pool or args.data}"
    else:
        how = f"{args.shots}-shot, seed {args.seed}"
    print(f"acc {_shown(*acc)}  acc_norm {_shown(*acc_norm)}  ({len(judged)} examples, {how})")
    print(f"scoring: {len(judged)} questions in {seconds:.1f} s, "
          f"{len(judged) / max(seconds, 1e-9):.1f} questions/s ({precision} on {device}, "
          f"batch {args.batch})")


def _shown(mean: float, stderr: float | None) -> str:
    return f"{mean:.4f}" if stderr is None else f"{mean:.4f} ± {stderr:.4f}"


def _add_lang(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", default="en",
                   help="language of the references, for ROUGE's words: en (rouge-score's "
                        "tokenizer, Porter stemming) or any other code (Unicode words, no "
                        "stemming)")


def add_commands(sub) -> None:
    ev = sub.add_parser("evaluate", help="score a model or a file of outputs: BLEU, chrF, "
                                         "ROUGE, multiple-choice accuracy, a fine-tuned "
                                         "encoder's task scores",
                        description="Score a translation model on a test set, any "
                                    "hypothesis file against its references, or a language "
                                    "model on multiple-choice questions.")
    kinds = ev.add_subparsers(dest="what", metavar="WHAT")
    kinds.required = True

    tr = kinds.add_parser("translate", help="translate --src and score it against --ref",
                          description="Translate --src and score against --ref: sacreBLEU "
                                      "(detokenised, cased) with its signature, chrF and "
                                      "ROUGE, and the decoding speed.")
    add_model_arg(tr, "a translation run or checkpoint folder")
    tr.add_argument("--src", required=True, help="source sentences (plain or .gz)")
    tr.add_argument("--ref", required=True, help="reference translations, line-aligned")
    tr.add_argument("--beam", type=int, help="beam size (default 4; 1: greedy; with a "
                                              "sampling flag 1: sampled)")
    tr.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty α")
    add_sampling_args(tr, temperature=None)
    tr.add_argument("--batch", type=int, default=64, help="sentences per batch")
    tr.add_argument("--limit", type=int, help="only the first N sentences")
    add_compile_arg(tr)
    _add_lang(tr)
    add_out_arg(tr, "write the translations to this file")
    add_runtime_args(tr)
    tr.set_defaults(func=cmd_evaluate_translate)

    add_task_commands(kinds)  # ner, classify, qa: cli/evaluate_tasks.py

    tx = kinds.add_parser("text", help="score a hypothesis file against a reference file",
                          description="BLEU, chrF and ROUGE-1/2/L/Lsum of --hyp against --ref, "
                                      "one example a line (\\n inside a line separates an "
                                      "example's sentences, for ROUGE-Lsum).")
    tx.add_argument("--hyp", required=True, help="hypotheses, one a line (plain or .gz)")
    tx.add_argument("--ref", required=True, help="references, line-aligned")
    _add_lang(tx)
    tx.set_defaults(func=cmd_evaluate_text)

    ch = kinds.add_parser(
        "choice", help="a language model on multiple-choice questions, zero- or few-shot",
        description="Score a language model on multiple-choice questions as EleutherAI's "
                    "lm-evaluation-harness does: each choice's log-likelihood after the prompt "
                    "(instruction + blank line, then K demonstrations 'context answer' each "
                    "followed by a blank line, then the context; the choice follows one space), "
                    "and the share of questions where the best choice is the answer (acc) and "
                    "where the best per character is (acc_norm). A prompt longer than the "
                    "model's context loses its first tokens, as the harness cuts it. An "
                    "encoder with a multiple-choice head ('attnlab train choice', an HF "
                    "...ForMultipleChoice folder) is scored by its logits instead: acc alone.")
    add_model_arg(ch, "a language model (a run or checkpoint folder, an HF folder, a .gguf "
                      "file, or smollm2) or a multiple-choice encoder")
    ch.add_argument("--data", required=True, metavar="FILE",
                    help="questions, one JSON object a line: context (str), choices (list of "
                         "str), answer (index of the right choice), optional instruction (str)")
    ch.add_argument("--shots", type=int, default=0, metavar="K",
                    help="demonstrations before each question")
    ch.add_argument("--pool", metavar="FILE",
                    help="where demonstrations come from, same format (default: the other "
                         "lines of --data); never the question itself or a copy of it")
    ch.add_argument("--pool-order", choices=["random", "file"], default="random",
                    help="random: K drawn for each question by random.Random('SEED:INDEX'), "
                         "INDEX being the question's 0-based position in --data; file: the "
                         "first K of the pool in file order, the same for every question "
                         "(lm-evaluation-harness's first_n sampler: pin the demonstrations "
                         "with --pool to reproduce a harness run)")
    ch.add_argument("--seed", type=int, default=0, help="seed of --pool-order random")
    ch.add_argument("--batch", type=int, default=1,
                    help="questions per forward pass (each question's choices always share "
                         "one pass, its prompt run once)")
    ch.add_argument("--limit", type=int, metavar="N",
                    help="score only the first N questions (demonstrations still come from "
                         "the whole pool)")
    add_integer_args(ch)
    ch.add_argument("--json", action="store_true",
                    help="print one JSON object instead: acc, acc_norm and their standard "
                         "errors, seconds (the scoring alone), and per question its line, "
                         "answer, log-likelihoods, decisions (acc's and acc_norm's) and the "
                         "choices' lengths in characters")
    add_runtime_args(ch)
    ch.set_defaults(func=cmd_evaluate_choice)

    lm = kinds.add_parser(
        "lm", help="a language model's perplexity on a text file",
        description="Perplexity, exp of the mean negative log-likelihood per token, of a whole "
                    "text file under a language model. A long text is read through a sliding "
                    "window: windows of --block tokens every --stride tokens, each scoring only "
                    "the tokens the ones before left unscored, so every token but the first is "
                    "scored once, with at least block - stride tokens of context after the "
                    "first window (Hugging Face's strided perplexity). The last line is "
                    "'perplexity: <value>'.")
    add_model_arg(lm, "a language model: a run or checkpoint folder, an HF folder, a .gguf "
                      "file, or smollm2")
    lm.add_argument("--text", required=True, metavar="FILE", help="UTF-8 text, read whole")
    lm.add_argument("--block", type=int, metavar="N",
                    help="tokens per window (default: the model's context, at most 1024)")
    lm.add_argument("--stride", type=int, metavar="S",
                    help="tokens between window starts, fewer than --block (default: half the "
                         "block)")
    lm.add_argument("--batch", type=int, default=1, help="windows per forward pass")
    lm.add_argument("--bos", action="store_true",
                    help="put the BOS token first, so that the text's first token is scored "
                         "too (as tokenizers that add BOS, Llama's, encode)")
    add_integer_args(lm)
    add_runtime_args(lm)
    lm.set_defaults(func=cmd_evaluate_lm)
