"""``attnlab evaluate choice``, end to end on a tiny random GPT with a byte-level BPE tokenizer:
what it prints equals the harness's recipe recomputed here the slow way (each prompt + choice
run alone, no cache, no batching), for a model folder, the same weights as a Hugging Face
folder, and 4-bit weights; every bad input is one line and exit code 2."""

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model, load, save_pretrained
from attnlab.cpu import for_decoding
from attnlab.storage import save_model_dir
from attnlab.tokenizers import BPETokenizer
from tests.cli.helpers import RUNNING, assert_bad_input, cli

QUESTIONS = [
    {"context": "The sky on a clear day is", "choices": ["blue", "green", "very red"],
     "answer": 0},
    {"context": "Two plus two is", "choices": ["four", "five"], "answer": 0,
     "instruction": "Answer the question."},
    {"context": "Q: What do cows drink?\nA:", "choices": ["water", "milk", "tea"], "answer": 0},
    {"context": "The opposite of hot is", "choices": ["warm", "cold"], "answer": 1},
    {"context": "Fish live in", "choices": ["trees", "the sea", "the desert sand"], "answer": 1},
    {"context": "The sky on a clear day is", "choices": ["blue", "green", "very red"],
     "answer": 0},  # a copy of the first: never its demonstration
]
POOL = [
    {"context": "Snow is", "choices": ["white", "black"], "answer": 0},
    {"context": "A cat says", "choices": ["woof", "meow"], "answer": 1},
    {"context": "The sun rises in the", "choices": ["east", "west"], "answer": 0},
]
LINE = re.compile(r"^acc (\d\.\d{4}) ± (\d\.\d{4})  acc_norm (\d\.\d{4}) ± (\d\.\d{4})  "
                  r"\((\d+) examples, (.+)\)$")


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model folder, the same weights as an HF folder, and the data files."""
    root = tmp_path_factory.mktemp("choice")
    texts = [q["context"] + " " + c for q in QUESTIONS + POOL for c in q["choices"]]
    tok = BPETokenizer.train(texts * 5, vocab_size=160)
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, d_ff=64, n_decoder_layers=2, max_len=128,
                                     pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    torch.manual_seed(0)
    model = build_model(config)
    save_model_dir(root / "model", model, config, {"text": tok.to_dict()})
    save_pretrained(model, root / "hf")
    tok.save_hf(root / "hf" / "tokenizer.json")
    return {"model": root / "model", "hf": root / "hf", "root": root,
            "data": jsonl(root / "data.jsonl", QUESTIONS), "pool": jsonl(root / "pool.jsonl", POOL)}


def recomputed(folder, questions, demos_of, int4: bool = False):
    """(scores per question, acc, acc_norm): the harness's recipe written out for these
    prompts (none ends in whitespace, and none is empty). ``int4``: on ``load(folder,
    int4=True)``, prepared as integer models are (``for_decoding``: an int8 output layer)."""
    loaded = load(folder, int4=int4)
    model, tok = loaded.model, loaded.tokenizer
    if int4:
        model = for_decoding(model, "cpu", "bf16", integer=True)
    scores, acc, acc_norm = [], [], []
    for i, q in enumerate(questions):
        prompt = (q["instruction"] + "\n\n" if "instruction" in q else "") + "".join(
            f"{d['context']} {d['choices'][d['answer']]}\n\n" for d in demos_of(i)) + q["context"]
        context = tok.encode(prompt)
        row = []
        for choice in q["choices"]:
            whole = tok.encode(prompt + " " + choice)
            cont = whole[len(context):]
            with torch.no_grad():
                logits = model(torch.tensor([whole[:-1]]))[0, -len(cont):]
            logp = torch.log_softmax(logits.double(), -1)
            row.append(float(sum(logp[t, token] for t, token in enumerate(cont))))
        scores.append(row)
        lengths = np.array([float(len(c)) for c in q["choices"]])
        acc.append(float(np.argmax(row) == q["answer"]))
        acc_norm.append(float(np.argmax(np.array(row) / lengths) == q["answer"]))
    return scores, acc, acc_norm


def stderr(values):
    return float(np.std(values, ddof=1) / np.sqrt(len(values)))


def run(capsys, files, *flags, model="model", precision="fp32"):
    r = cli(capsys, "evaluate", "choice", "--model", files[model], "--data", files["data"],
            "--device", "cpu", "--precision", precision, *flags)
    assert r.code == 0, r.err
    return r


def check(capsys, files, flags, want, how, precision="fp32", shown="fp32"):
    """The printed line, and the --json numbers (the questions batched by 4 there), against
    the recomputation; ``shown``: the precision the scoring line names."""
    scores, acc, acc_norm = want
    r = run(capsys, files, *flags, precision=precision)
    lines = r.out.strip().splitlines()
    m = LINE.match(lines[0])
    assert m and len(lines) == 2, r.out
    assert m.groups() == (f"{np.mean(acc):.4f}", f"{stderr(acc):.4f}",
                          f"{np.mean(acc_norm):.4f}", f"{stderr(acc_norm):.4f}",
                          str(len(scores)), how)
    assert re.match(rf"scoring: {len(scores)} questions in [\d.]+ s, [\d.]+ questions/s "
                    rf"\({shown} on cpu, batch 1\)$", lines[1]), lines[1]
    j = json.loads(run(capsys, files, *flags, "--json", "--batch", "4", precision=precision).out)
    np.testing.assert_allclose([s for row in j["loglikelihoods"] for s in row],
                               [s for row in scores for s in row], rtol=1e-5, atol=1e-5)
    assert (j["acc"], j["acc_norm"]) == (pytest.approx(np.mean(acc)),
                                         pytest.approx(np.mean(acc_norm)))
    assert j["acc_stderr"] == pytest.approx(stderr(acc)) and j["examples"] == len(scores)
    assert j["decisions"] == [int(np.argmax(row)) for row in scores]
    assert j["lengths"] == [[len(c) for c in q["choices"]] for q in QUESTIONS]
    assert j["lines"] == list(range(1, len(QUESTIONS) + 1)) and j["batch"] == 4
    return r


def test_zero_shot_equals_the_recipe_recomputed(capsys, files):
    r = check(capsys, files, [], recomputed(files["model"], QUESTIONS, lambda i: []), "0-shot")
    assert r.err.splitlines() == [f"attnlab evaluate: running {files['model']} on cpu, fp32, "
                                  f"{torch.get_num_threads()} threads"]


def test_pinned_demonstrations_from_a_pool_equal_the_recipe_recomputed(capsys, files):
    check(capsys, files, ["--shots", "2", "--pool", files["pool"], "--pool-order", "file"],
          recomputed(files["model"], QUESTIONS, lambda i: POOL[:2]),
          f"2-shot, the first 2 of {files['pool']}")


def test_first_demonstrations_from_the_data_skip_the_question_and_its_copies(capsys, files):
    def demos(i):  # the first two other lines, and never line 1 or 6 (the same question)
        same = [j for j, q in enumerate(QUESTIONS) if q == QUESTIONS[i]]
        return [q for j, q in enumerate(QUESTIONS) if j not in same][:2]

    assert demos(0) == QUESTIONS[1:3] and demos(1) == [QUESTIONS[0], QUESTIONS[2]]
    check(capsys, files, ["--shots", "2", "--pool-order", "file"],
          recomputed(files["model"], QUESTIONS, demos), f"2-shot, the first 2 of {files['data']}")


def test_random_demonstrations_follow_the_documented_draw_and_repeat(capsys, files):
    import random

    def demos(i):
        return [POOL[j] for j in random.Random(f"7:{i}").sample(range(len(POOL)), 3)]

    flags = ["--shots", "3", "--seed", "7", "--pool", files["pool"], "--quiet"]
    r = check(capsys, files, flags, recomputed(files["model"], QUESTIONS, demos),
              "3-shot, seed 7")
    assert r.err == ""
    again = run(capsys, files, *flags)
    assert again.out.splitlines()[0] == r.out.splitlines()[0]


def test_an_hf_folder_of_the_same_weights_prints_the_same(capsys, files):
    flags = ("--shots", "1", "--pool", files["pool"], "--quiet", "--limit", "4")
    ours = run(capsys, files, *flags).out.splitlines()[0]
    theirs = run(capsys, files, *flags, model="hf").out.splitlines()[0]
    assert theirs == ours and ours.endswith("(4 examples, 1-shot, seed 0)")


def test_int4_weights_equal_the_recipe_on_the_4_bit_model(capsys, files, monkeypatch):
    """``--int4``: the printed line and the --json numbers equal the recipe recomputed on
    ``load(model, int4=True)``, whose log-likelihoods part from the float model's by more than
    the comparison's tolerance (so an ``--int4`` that does nothing fails). The matrices around
    the integer ones stay float32 (``ATTNLAB_NATIVE_BF16=0``, as on a CPU without native
    bf16): in bf16, rounding moves a batch's scores by as much as 4-bit weights do here."""
    from attnlab.cpu import kernels

    kernels.available()  # built (or not) as for the rest of the session, before the override
    monkeypatch.setenv("ATTNLAB_NATIVE_BF16", "0")
    want = recomputed(files["model"], QUESTIONS, lambda i: [], int4=True)
    full = recomputed(files["model"], QUESTIONS, lambda i: [])[0]
    assert not np.allclose(np.concatenate(want[0]), np.concatenate(full), rtol=1e-5, atol=1e-5)
    r = check(capsys, files, ["--int4"], want, "0-shot", precision="auto", shown="bf16")
    assert RUNNING.match(r.err.strip()) and "int4 weights, float32 float matrices" in r.err


def shortened(files, tmp_path, block: int):
    """The model folder's weights with a trained context of ``block`` tokens."""
    loaded = load(files["model"])
    short = dataclasses.replace(loaded.config, block_size=block)
    return save_model_dir(tmp_path / "short", loaded.model, short,
                          {"text": loaded.tokenizer.to_dict()})


def test_a_prompt_longer_than_the_context_is_cut_with_a_warning(capsys, files, tmp_path):
    longest = max(len(load(files["model"]).tokenizer.encode(" " + c))
                  for q in QUESTIONS for c in q["choices"])
    short = shortened(files, tmp_path, longest + 2)
    r = cli(capsys, "evaluate", "choice", "--model", short, "--data", files["data"],
            "--shots", "2", "--device", "cpu", "--precision", "fp32", "--quiet")
    assert r.code == 0, r.err
    assert r.err.strip() == ("attnlab: warning: 6 of 6 prompts are longer than the model's "
                             f"context of {longest + 2} tokens: their first tokens are left out, "
                             "as lm-evaluation-harness does")
    assert LINE.match(r.out.splitlines()[0])


def test_a_choice_longer_than_the_context_is_named(capsys, files, tmp_path):
    short = shortened(files, tmp_path, 3)
    r = cli(capsys, "evaluate", "choice", "--model", short, "--data", files["data"],
            "--device", "cpu")
    line = assert_bad_input(r, f"{files['data']}:1: choice ", "more than the model's context of 3")
    assert re.search(r":1: choice \d is \d+ tokens", line), line


# --- bad input: one line naming the problem, exit code 2, before the model runs ---------------
@pytest.mark.parametrize("row, named", [
    ({"context": "c", "choices": ["a", "b"], "answer": 2}, "'answer' is 2, outside the 2 choices"),
    ({"context": "c", "choices": ["a", "b"], "answer": -1}, "'answer' is -1"),
    ({"context": "c", "choices": ["a", "b"], "answer": True}, "'answer' must be the index"),
    ({"context": "c", "choices": ["a", ""], "answer": 0}, "choice 1 is an empty string"),
    ({"context": "c", "choices": ["a"], "answer": 0}, "needs at least 2"),
    ({"context": "c", "answer": 0}, "field 'choices' missing"),
    ({"context": 3, "choices": ["a", "b"], "answer": 0}, "'context' must be a string"),
])
def test_a_bad_line_is_named_with_its_file_and_line(capsys, files, tmp_path, row, named):
    data = jsonl(tmp_path / "bad.jsonl", [QUESTIONS[0], row])
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", data,
            "--device", "cpu")
    assert_bad_input(r, f"{data}:2", named)
    assert r.out == ""


def test_an_empty_file_and_a_missing_one(capsys, files, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", empty)
    assert_bad_input(r, str(empty), "no examples")
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", tmp_path / "no")
    assert_bad_input(r, str(tmp_path / "no"))


def test_more_shots_than_demonstrations_is_named_with_the_numbers(capsys, files):
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", files["data"],
            "--shots", "5")
    assert_bad_input(r, "--shots 5", "the 4 demonstrations available to", f"{files['data']}:1",
                     "6 examples in", "less the example itself, less 1 with the same content")
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", files["data"],
            "--shots", "4", "--pool", files["pool"])
    assert_bad_input(r, "--shots 4", "the 3 demonstrations available", f"3 examples in "
                     f"{files['pool']}")


@pytest.mark.parametrize("flags, named", [
    (("--shots", "-1"), "--shots must be >= 0, got -1"),
    (("--limit", "0"), "--limit must be >= 1, got 0"),
    (("--batch", "0"), "--batch must be >= 1, got 0"),
    (("--int4", "--precision", "fp32"), "--int4 sets its own precision"),
    (("--int8", "--precision", "fp32"), "--int8 sets its own precision"),
    (("--int4", "--int8"), "--int4 or --int8, not both"),
])
def test_bad_flags(capsys, files, flags, named):
    r = cli(capsys, "evaluate", "choice", "--model", files["model"], "--data", files["data"],
            *flags)
    assert_bad_input(r, named)


def test_an_encoder_decoder_model_is_refused(capsys, files, tmp_path):
    config = ModelConfig.from_preset("tiny", vocab_size=20, max_len=16)
    torch.manual_seed(0)
    folder = save_model_dir(tmp_path / "mt", build_model(config), config, {})
    r = cli(capsys, "evaluate", "choice", "--model", folder, "--data", files["data"],
            "--device", "cpu")
    assert_bad_input(r, str(folder), "not a language model")


def test_symbols_outside_a_character_vocabulary_are_named_once(capsys, tmp_path):
    """A character model that never saw 'T', '€' or a newline: one warning naming them, and the
    newline only when the prompt has one (a demonstration's blank line)."""
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer.train(["the sky is blue green red"])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, d_ff=64, n_decoder_layers=1, max_len=64,
                                     pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    folder = save_model_dir(tmp_path / "char", build_model(config), config,
                            {"text": tok.to_dict()})
    data = jsonl(tmp_path / "c.jsonl", [{"context": "The sky is", "choices": ["blue", "red"],
                                         "answer": 0},
                                        {"context": "sky", "choices": ["red", "€"], "answer": 0}])
    warned = "attnlab: warning: {}: {} symbol(s) not in the model's vocabulary, read as <unk>: {}"
    r = cli(capsys, "evaluate", "choice", "--model", folder, "--data", data, "--quiet")
    assert r.code == 0 and r.err.strip() == warned.format(data, 2, "'T' '€'")
    r = cli(capsys, "evaluate", "choice", "--model", folder, "--data", data, "--quiet",
            "--shots", "1")
    assert r.code == 0 and r.err.strip() == warned.format(data, 3, "'\\n' 'T' '€'")
