"""Training you can watch: ``train translate``'s validation data (``--holdout N``,
``--valid-src/--valid-tgt``, or none, which it says), the line each evaluation prints, the BLEU
after training on real text (exact match stays for the numbers task), and ``average`` asked
for more checkpoints than a run has.

Covered elsewhere: one line per evaluation on rank 0 only under torchrun,
tests/training/test_trainer.py::test_ddp_two_processes_equal_one_process.
"""

import json
import random
import re

import pytest
from sacrebleu.metrics import BLEU

from attnlab.data import numbers_corpus, read_parallel
from attnlab.generation import exact_match, translate
from attnlab.storage import load
from attnlab.training import trainer
from tests.cli.helpers import assert_bad_input, cli

COLOURS = "red green blue black white pink gray brown".split()
# tiny, without dropout, a short warmup: 20 steps measured BLEU 84 on the held-out colours
FAST = ["--preset", "tiny", "--set", "dropout=0", "--tgt-tokenizer", "word", "--warmup", "5",
        "--lr-factor", "0.2", "--max-tokens", "256", "--no-progress", "--device", "cpu",
        "--precision", "fp32"]
NO_VALIDATION = ("no validation data: pass --valid-src/--valid-tgt or --holdout N to see "
                 "validation loss and BLEU")


def write_pairs(folder, name: str, sources: list[str]) -> tuple:
    """``name.src`` and ``name.tgt``: each source's target is "the colours you asked for are"
    and its first word. Returns the two paths."""
    src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
    src.write_text("".join(s + "\n" for s in sources))
    tgt.write_text("".join(f"the colours you asked for are {s.split()[0]}\n" for s in sources))
    return src, tgt


def colour_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(COLOURS) for _ in range(3)) for _ in range(n)]


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """120 training pairs (``train.src``/``train.tgt``) and 10 validation pairs."""
    folder = tmp_path_factory.mktemp("colours")
    write_pairs(folder, "train", colour_sentences(120, seed=0))
    write_pairs(folder, "valid", colour_sentences(10, seed=1))
    return folder


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def eval_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"step \d+: val loss", line)]


def expected_eval_lines(run) -> list[str]:
    """What each evaluation should have printed, from metrics.jsonl: the loss and the running
    minimum."""
    lines, best = [], float("inf")
    for row in metrics(run):
        if "val_loss" in row:
            best = min(best, row["val_loss"])
            lines.append(f"step {row['step']}: val loss {row['val_loss']:.4f} (best {best:.4f})")
    return lines


def bleu_of(model_dir, pairs: list[tuple[str, str]]) -> float:
    """sacreBLEU's corpus BLEU of the model's greedy translations of ``pairs``."""
    loaded = load(model_dir)
    hyps = translate(loaded.model, loaded.tokenizers["source"], loaded.tokenizers["target"],
                     [s for s, _ in pairs])
    return BLEU().corpus_score(hyps, [[t for _, t in pairs]]).score


def test_real_data_without_validation_data_trains_on_everything_and_says_so(capsys, colours,
                                                                            tmp_path):
    run = tmp_path / "run"
    r = cli(capsys, "train", "translate", "--src", colours / "train.src", "--tgt",
            colours / "train.tgt", *FAST, "--steps", "2", "--eval-every", "1", "--out", run)
    assert r.code == 0, r.err
    assert r.out.splitlines().count(NO_VALIDATION) == 1
    assert "data: kept 120 pairs;" in r.out  # nothing held back
    assert "exact match" not in r.out and "validation BLEU" not in r.out
    assert eval_lines(r.out) == [] and not any("val_loss" in row for row in metrics(run))


def test_holdout_validates_on_the_last_pairs_and_reports_their_bleu(capsys, colours, tmp_path):
    run, src, tgt = tmp_path / "run", colours / "train.src", colours / "train.tgt"
    r = cli(capsys, "train", "translate", "--src", src, "--tgt", tgt, "--holdout", "20", *FAST,
            "--steps", "20", "--eval-every", "10", "--average-last", "3", "--out", run)
    assert r.code == 0, r.err
    assert "data: kept 100 pairs;" in r.out
    assert f"validation: the last 20 pairs of {src} and {tgt}, held out" in r.out
    assert NO_VALIDATION not in r.out and "exact match" not in r.out
    # one line per evaluation, as metrics.jsonl has it; the end-of-training report stays
    lines = eval_lines(r.out)
    assert len(lines) == 2 and lines == expected_eval_lines(run)
    last = metrics(run)[-1]["val_loss"]
    assert f"validation loss {last:.4f} after 20 steps" in r.out
    # only the last checkpoint was kept (--save-every 500): averaging says it used one
    assert (f"attnlab: warning: asked for the last 3 checkpoints, {run} has only 1: "
            "averaged 1") in r.err
    held_out = read_parallel(src, tgt)[-20:]
    bleu = bleu_of(run / "final", held_out)
    assert 0 < bleu <= 100  # the constant words learned (84 on the developer's CPU)
    assert f"validation BLEU {bleu:.2f} (sacreBLEU, greedy) on 20 of 20 validation pairs" in r.out


def test_valid_files_validate_and_sources_too_long_are_left_out(capsys, colours, tmp_path):
    """A validation source beyond ``max_len`` counts in neither the loss nor the BLEU."""
    sentences = colour_sentences(10, seed=1) + [" ".join(COLOURS * 3)]  # 24 words + eos
    vsrc, vtgt = write_pairs(tmp_path, "valid", sentences)
    run = tmp_path / "run"
    r = cli(capsys, "train", "translate", "--src", colours / "train.src", "--tgt",
            colours / "train.tgt", "--valid-src", vsrc, "--valid-tgt", vtgt, *FAST,
            "--set", "max_len=16", "--steps", "20", "--eval-every", "5", "--out", run)
    assert r.code == 0, r.err
    assert "data: kept 120 pairs;" in r.out
    assert (f"validation: 11 pairs from {vsrc} and {vtgt} (10 of them within 16 tokens)"
            in r.out)
    assert len(eval_lines(r.out)) == 4 and eval_lines(r.out) == expected_eval_lines(run)
    bleu = bleu_of(run, read_parallel(vsrc, vtgt)[:10])
    assert 0 < bleu <= 100
    assert (f"validation BLEU {bleu:.2f} (sacreBLEU, greedy) on 10 of 11 validation pairs; "
            "1 with a source longer than 16 tokens left out") in r.out


def test_the_numbers_task_keeps_exact_match(capsys, tmp_path):
    run = tmp_path / "run"
    r = cli(capsys, "train", "translate", "--task", "numbers", "--n-train", "200", "--holdout",
            "5", "--steps", "2", "--preset", "tiny", "--max-tokens", "512", "--out", run,
            "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert "; 5 held-out numbers never seen in training;" in r.out
    _, test = numbers_corpus(200, 5, seed=0)
    loaded = load(run)
    accuracy, _ = exact_match(loaded.model, loaded.tokenizers["source"],
                              loaded.tokenizers["target"], test)
    assert f"held-out exact match: {accuracy:.1%} of 5" in r.out
    assert "BLEU" not in r.out
    assert eval_lines(r.out) == expected_eval_lines(run) and len(eval_lines(r.out)) == 1


@pytest.mark.parametrize("flags, named", [
    (["--holdout", "0"], "--holdout must be >= 1, got 0"),
    (["--holdout", "120"], "holding out 120 pairs leaves none to train on"),
    (["--holdout", "5", "--valid-src", "{v}.src", "--valid-tgt", "{v}.tgt"], "not both"),
    (["--valid-src", "{v}.src"], "give both --valid-src FILE and --valid-tgt FILE"),
    (["--valid-src", "{v}.src", "--valid-tgt", "{t}.src"], "has 10 lines but"),
])
def test_bad_validation_flags_are_one_line_errors(capsys, colours, tmp_path, flags, named):
    (tmp_path / "short.src").write_text("red\n")
    flags = [f.format(v=colours / "valid", t=tmp_path / "short") for f in flags]
    r = cli(capsys, "train", "translate", "--src", colours / "train.src", "--tgt",
            colours / "train.tgt", *flags, *FAST, "--out", tmp_path / "run")
    assert_bad_input(r, named)
    assert not (tmp_path / "run").exists()


def test_numbers_task_refuses_validation_files(capsys, colours, tmp_path):
    r = cli(capsys, "train", "translate", "--task", "numbers", "--valid-src",
            colours / "valid.src", "--valid-tgt", colours / "valid.tgt", *FAST,
            "--out", tmp_path / "run")
    assert_bad_input(r, "--holdout N, not --valid-src/--valid-tgt")


@pytest.mark.parametrize("progress", [False, True])
def test_each_evaluation_prints_its_loss_and_the_best_so_far(capsys, monkeypatch, tmp_path,
                                                             progress):
    """Validation losses that rise and fall: "best" is the running minimum. With the progress
    bar on, the lines go to stdout above it and the bar (stderr) still ends at 4/4."""
    losses = iter([3.0, 2.0, 2.5, 1.0])
    monkeypatch.setattr(trainer, "evaluate", lambda *args, **kwargs: next(losses))
    (tmp_path / "text.txt").write_text("to be or not to be, that is the question. " * 20)
    run = tmp_path / "run"
    r = cli(capsys, "train", "lm", "--text", tmp_path / "text.txt", "--set", "d_model=32",
            "--set", "n_heads=2", "--set", "d_ff=64", "--set", "n_decoder_layers=1",
            "--block", "8", "--batch", "2", "--steps", "4", "--eval-every", "1", "--out", run,
            "--device", "cpu", "--precision", "fp32", *([] if progress else ["--no-progress"]))
    assert r.code == 0, r.err
    assert eval_lines(r.out) == ["step 1: val loss 3.0000 (best 3.0000)",
                                 "step 2: val loss 2.0000 (best 2.0000)",
                                 "step 3: val loss 2.5000 (best 2.0000)",
                                 "step 4: val loss 1.0000 (best 1.0000)"]
    assert [row["val_loss"] for row in metrics(run)] == [3.0, 2.0, 2.5, 1.0]
    assert "validation loss 1.0000 after 4 steps" in r.out
    assert ("4/4" in r.err) == progress and "val loss" not in r.err


def test_average_of_fewer_checkpoints_than_asked_says_how_many(capsys, translation_run,
                                                               tmp_path):
    run = translation_run.path  # two checkpoints
    r = cli(capsys, "average", "--model", run, "--last", "5", "--out", tmp_path / "five")
    assert r.code == 0, r.err
    assert r.err == (f"attnlab: warning: asked for the last 5 checkpoints, {run} has only 2: "
                     "averaged 2\n")
    assert r.out == f"averaged step-00000001, step-00000002 into {tmp_path / 'five'}\n"
    r = cli(capsys, "average", "--model", run, "--last", "2", "--out", tmp_path / "two")
    assert r.code == 0 and r.err == ""
