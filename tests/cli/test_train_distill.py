"""``attnlab train distill`` for a classifier (soft targets and hidden states, the student
initialised from the teacher's layers), a language model (a student preset) and a translator
(sequence level); bad input is one line."""

import json
import random

import pytest
import torch

from attnlab import ModelConfig, build_model, load
from attnlab.storage import save_model_dir
from attnlab.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer
from tests.cli.helpers import assert_bad_input, cli

WORDS = "spam offer win money free prize hello meeting lunch report friday team".split()


@pytest.fixture(scope="module")
def classifier_teacher(tmp_path_factory):
    """A 4-layer BERT classifier that learned (a few steps) that spam words mean spam."""
    root = tmp_path_factory.mktemp("distill")
    tok = WordPieceTokenizer.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    config = ModelConfig.from_preset("bert-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, d_ff=64, n_encoder_layers=4, max_len=32,
                                     head="classify", num_labels=2,
                                     extra={"labels": ["ham", "spam"]})
    torch.manual_seed(0)
    model = build_model(config)
    rng = random.Random(0)
    rows = []
    for n in range(200):
        spam = n % 2 == 0
        words = [rng.choice(WORDS[:6] if spam else WORDS[6:]) for _ in range(5)]
        rows.append({"id": str(n), "text": " ".join(words), "label": "spam" if spam else "ham"})
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return save_model_dir(root / "teacher", model, config, {"text": tok.to_dict()}), data


FAST = ("--no-progress", "--device", "cpu", "--precision", "fp32")


def test_a_classifier_student_from_teacher_layers(classifier_teacher, tmp_path, capsys):
    teacher, data = classifier_teacher
    r = cli(capsys, "train", "distill", "--teacher", teacher, "--student-layers", "2",
            "--hidden-weight", "1", "--data", data, "--text-field", "text", "--label-field",
            "label", "--steps", "20", "--eval-every", "10", "--batch", "16", "--out",
            tmp_path / "s", *FAST)
    assert r.code == 0, r.err
    assert "distilled at T=2.0, α=0.5, hidden-state weight 1.0" in r.out
    assert "student: 2 of the teacher's 4 layers, initialised from its layers [0, 2]" in r.out
    assert "test: accuracy" in r.out
    student = load(tmp_path / "s").model
    assert student.config.n_encoder_layers == 2 and student.config.extra["labels"] == [
        "ham", "spam"]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_language_model_student_from_a_preset(kind, tmp_path, capsys):
    """The student reads the text with the teacher's own tokenizer, whatever its kind."""
    text = "the cat sat on the mat. the dog sat on the log. " * 30
    tok = (CharTokenizer.train([text]) if kind == "char"
           else BPETokenizer.train([text], vocab_size=300, min_frequency=1))
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, d_ff=64, n_decoder_layers=2, max_len=64)
    teacher = save_model_dir(tmp_path / "t", build_model(config), config,
                             {"text": tok.to_dict()})
    (tmp_path / "text.txt").write_text(text)
    r = cli(capsys, "train", "distill", "--teacher", teacher, "--student-preset", "gpt-mini",
            "--set", "d_model=16", "--set", "n_heads=2", "--set", "n_decoder_layers=1",
            "--text", tmp_path / "text.txt", "--block", "16", "--batch", "4", "--steps", "4",
            "--eval-every", "2", "--out", tmp_path / "s", *FAST)
    assert r.code == 0, r.err
    assert f"({kind} tokenizer, vocabulary {tok.vocab_size})" in r.out
    loaded = load(tmp_path / "s")
    assert loaded.model.config.d_model == 16
    assert loaded.model.config.vocab_size == tok.vocab_size
    assert loaded.tokenizer.encode(text) == tok.encode(text)


def test_sequence_level_distillation_of_a_translator(translation_run, tmp_path, capsys):
    sources = tmp_path / "src.txt"
    sources.write_text("\n".join(str(n) for n in range(100, 140)) + "\n")
    r = cli(capsys, "train", "distill", "--teacher", translation_run.path, "--student-preset",
            "tiny", "--set", "d_model=32", "--set", "n_heads=2", "--src", sources, "--beam",
            "2", "--steps", "2", "--out", tmp_path / "s", *FAST)
    assert r.code == 0, r.err
    assert "the teacher translated 40 sources (beam 2)" in r.out


@pytest.mark.parametrize("extra, message", [
    ((), "give the student as --student-layers N"),
    (("--student-layers", "4"), "between 1 and 3"),
    (("--student-layers", "2"), "give --data, --text-field and --label-field"),
    (("--student-preset", "gpt-mini", "--data", "x"), "--preset gpt-mini is not"),
])
def test_bad_distill_arguments(classifier_teacher, tmp_path, capsys, extra, message):
    teacher, data = classifier_teacher
    if "--data" not in extra and "--student-layers" in extra and extra[1] == "4":
        extra = (*extra, "--data", data, "--text-field", "text", "--label-field", "label")
    r = cli(capsys, "train", "distill", "--teacher", teacher, *extra, "--out", tmp_path / "s",
            *FAST)
    assert_bad_input(r, message)
