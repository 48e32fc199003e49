"""``attnlab translate``, ``evaluate`` and ``average``.

Covered elsewhere, not repeated here:

- translate: happy path tests/training/test_trainer.py::
  test_translate_from_stdin_and_checkpoint_averaging (one line out per line in); bad input
  tests/training/test_trainer.py::test_bad_input_one_line_exit_2 (corrupt and truncated weights,
  a sentence longer than the model's context), tests/training/test_lm.py::
  test_translation_commands_refuse_a_language_model.
- evaluate: happy path tests/training/test_evaluate.py::test_shared_bpe_training_and_evaluate
  (sacreBLEU's scores and signature, ``--out``, ``--beam``); bad input
  ::test_evaluate_rejects_misaligned_files, tests/training/test_lm.py::
  test_translation_commands_refuse_a_language_model.
- average: happy path tests/training/test_trainer.py::
  test_average_command_writes_a_loadable_model_folder; bad input tests/training/test_lm.py::
  test_translation_commands_refuse_a_language_model (``--last 0``: exit code and message only).

Here: a missing model folder (translate), a run without checkpoints (average, with the whole
one-line contract), an ``--out`` that cannot be created (evaluate, average), and sampled
translation (``--temperature``, ``--top-k``, ``--top-p``, ``--seed``) in translate and evaluate.
"""

import io
import re

import pytest
import torch

from attnlab import ModelConfig, Transformer, save_pretrained
from tests.cli.helpers import assert_bad_input, cli, not_a_folder


def test_translate_missing_model_is_named(capsys, tmp_path):
    missing = tmp_path / "no-such-run"
    r = cli(capsys, "translate", "--model", missing, "--device", "cpu", "forty-two")
    assert_bad_input(r, str(missing))
    assert r.out == ""


def test_average_a_folder_without_checkpoints_is_named(capsys, tmp_path):
    (tmp_path / "empty-run").mkdir()
    r = cli(capsys, "average", "--model", tmp_path / "empty-run", "--last", "2")
    assert_bad_input(r, str(tmp_path / "empty-run"))
    assert not (tmp_path / "empty-run" / "final").exists()


def test_average_out_that_cannot_be_created_is_named(capsys, tmp_path, translation_run):
    out = not_a_folder(tmp_path)
    r = cli(capsys, "average", "--model", translation_run.path, "--last", "2", "--out", out)
    assert_bad_input(r, str(out.parent))


def test_evaluate_out_that_cannot_be_created_is_named(capsys, tmp_path, translation_run):
    (tmp_path / "src.en").write_text("one\n")
    (tmp_path / "ref.de").write_text("eins\n")
    out = not_a_folder(tmp_path)
    r = cli(capsys, "evaluate", "translate", "--model", translation_run.path, "--src",
            tmp_path / "src.en", "--ref", tmp_path / "ref.de", "--beam", "1", "--out", out,
            "--device", "cpu", "--precision", "fp32")
    assert_bad_input(r, str(out.parent))


def test_translate_a_hugging_face_folder_without_tokenizers_is_named(capsys, tmp_path):
    """A MarianMTModel folder loads as a model, but its SentencePiece tokenizer is not read."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset(
        "tiny", vocab_size=32, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
        n_decoder_layers=1, positional="sinusoidal-split", output_bias=True, pad_id=0, unk_id=0,
        bos_id=0,
        eos_id=1))
    save_pretrained(model, tmp_path / "marian")
    r = cli(capsys, "translate", "--model", tmp_path / "marian", "--device", "cpu", "ein Satz")
    assert_bad_input(r, str(tmp_path / "marian"), "tokenizer")


def test_translate_stdin_that_is_not_utf8_is_named(capsys, monkeypatch, translation_run):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"forty-two\n\xff\xfe\n"),
                                                      encoding="utf-8"))
    r = cli(capsys, "translate", "--model", translation_run.path, "--device", "cpu")
    assert_bad_input(r, "standard input")


def test_words_outside_the_source_vocabulary_are_named(capsys, translation_run):
    """The demo's translator knows number words only: 'apples' is named in one warning (it
    would otherwise be dropped without a word) and translation goes on."""
    r = cli(capsys, "translate", "--model", translation_run.path, "forty-two apples", "--device",
            "cpu", "--quiet")
    assert r.code == 0 and len(r.out.splitlines()) == 1
    assert r.err.splitlines() == ["attnlab: warning: input: 1 symbol(s) not in the model's "
                                  "vocabulary, read as <unk>: 'apples'"]


def test_translate_and_evaluate_take_beam_and_compile(capsys, translation_run, monkeypatch):
    """``translate --beam 2 --compile`` and ``evaluate translate --compile`` decode through
    one compiled step (a graph is made; none without the flag) and answer every sentence.
    The 2-step model's beams are near ties, so their text is not compared here: the compiled
    searches' tokens and scores are, on a confident model and a source padded as
    ``translate`` pads it, in tests/generation/test_compiled.py. The step is traced by Dynamo
    and run eagerly here."""
    import functools

    from torch._dynamo.utils import counters

    import attnlab.generation.compiled as compiled

    monkeypatch.setattr(compiled, "CompiledStep",
                        functools.partial(compiled.CompiledStep, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    sentences = ["a b c", "c b a d", "d"]
    base = ("translate", "--model", translation_run.path, "--device", "cpu", "--precision",
            "fp32", "--beam", "2", *sentences)
    plain = cli(capsys, *base)
    assert plain.code == 0, plain.err
    assert counters["stats"]["unique_graphs"] == 0  # nothing compiled unless asked
    fast = cli(capsys, *base, "--compile")
    assert fast.code == 0, fast.err
    assert len(fast.out.splitlines()) == 3
    assert counters["stats"]["unique_graphs"] == 1
    src, ref = translation_run.path.parent / "src.txt", translation_run.path.parent / "ref.txt"
    src.write_text("\n".join(sentences) + "\n")
    ref.write_text("x\ny\nz\n")
    out = translation_run.path.parent / "hyps.txt"
    r = cli(capsys, "evaluate", "translate", "--model", translation_run.path, "--src", src,
            "--ref", ref, "--beam", "1", "--out", out, "--device", "cpu", "--precision",
            "fp32", "--compile")
    assert r.code == 0, r.err
    assert len(out.read_text().splitlines()) == 3
    assert counters["stats"]["unique_graphs"] == 2  # greedy: another batch shape
    r = cli(capsys, "translate", "--model", translation_run.path, "--beam", "0", "x")
    assert_bad_input(r, "--beam")


def sampled(capsys, run, *flags):
    r = cli(capsys, "translate", "--model", run, "--device", "cpu", "--precision", "fp32",
            "--temperature", "0.9", "--top-k", "6", "a b c", "c b a d", "d", *flags)
    assert r.code == 0, r.err
    return r


def test_translate_samples_as_generate_does(capsys, translation_run):
    """``--temperature --top-k --seed``: the library's ``translate`` with a generator of that
    seed (tests/generation/test_seq2seq_sampling.py checks its draws); without ``--seed`` a
    fresh one, printed as ``generate`` prints it, repeats the run."""
    from attnlab import load
    from attnlab.generation.seq2seq import translate

    loaded = load(translation_run.path)
    sentences = ["a b c", "c b a d", "d"]
    want = translate(loaded.model, loaded.tokenizers["source"], loaded.tokenizers["target"],
                     sentences, temperature=0.9, top_k=6,
                     generator=torch.Generator().manual_seed(3))
    assert sampled(capsys, translation_run.path, "--seed", "3").out.splitlines() == want
    fresh = sampled(capsys, translation_run.path)
    seed = re.search(r"^attnlab translate: sampling with --seed (\d+)$", fresh.err, re.M)
    assert seed, fresh.err
    again = sampled(capsys, translation_run.path, "--seed", seed.group(1))
    assert again.out == fresh.out and "sampling with" not in again.err
    greedy = cli(capsys, "translate", "--model", translation_run.path, "--device", "cpu",
                 "--precision", "fp32", *sentences)
    draws = {sampled(capsys, translation_run.path, "--seed", str(s)).out for s in range(4)}
    assert draws != {greedy.out}  # the flags sample: four seeds are not all the greedy text


def test_evaluate_translate_samples_with_beam_one_unless_told(capsys, translation_run):
    """A sampling flag makes ``evaluate translate`` sample (beam 1, the translations of
    ``translate`` with the same flags); without one it searches with beam 4."""
    src, ref = translation_run.path.parent / "src.txt", translation_run.path.parent / "ref.txt"
    src.write_text("a b c\nc b a d\nd\n")
    ref.write_text("x\ny\nz\n")
    out = translation_run.path.parent / "sampled.txt"
    base = ("evaluate", "translate", "--model", translation_run.path, "--src", src, "--ref",
            ref, "--device", "cpu", "--precision", "fp32")
    r = cli(capsys, *base, "--temperature", "0.9", "--top-k", "6", "--seed", "3", "--out", out)
    assert r.code == 0, r.err
    assert "(sampled at temperature 0.9, top-k 6; fp32 on cpu)" in r.out
    assert out.read_text() == sampled(capsys, translation_run.path, "--seed", "3").out
    r = cli(capsys, *base)
    assert r.code == 0, r.err
    assert "(beam 4, alpha 0.6; fp32 on cpu)" in r.out


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("flags,named", [
    (("--beam", "3", "--temperature", "0.5"), ("--beam 3", "--temperature")),
    (("--beam", "2", "--seed", "1"), ("--beam 2", "--seed")),
    (("--top-p", "1.5"), ("--top-p",)),
    (("--temperature", "-1"), ("--temperature",)),
    (("--top-k", "0"), ("--top-k",)),
])
def test_sampling_flags_that_cannot_work_are_one_line(capsys, translation_run, tmp_path,
                                                      command, flags, named):
    if command == "translate":
        r = cli(capsys, "translate", "--model", translation_run.path, *flags, "a b")
    else:
        (tmp_path / "src.txt").write_text("a b\n")
        r = cli(capsys, "evaluate", "translate", "--model", translation_run.path, "--src",
                tmp_path / "src.txt", "--ref", tmp_path / "src.txt", *flags)
    assert_bad_input(r, *named)


def test_a_quantised_translators_float_parts_take_the_precision_asked(capsys, translation_run,
                                                                       tmp_path):
    """``translate`` and ``evaluate translate`` load a quantised folder with its float parts
    (embeddings, norms, attention, the output layer) in the precision asked and its integer
    layers as codes: ``--precision fp32`` runs them in float32 even where ``quantize`` stored
    them in bf16, and translates as that model does, computed here."""
    import argparse

    from attnlab.cli.common import load_for
    from attnlab.generation.seq2seq import translate
    from attnlab.nn.quantized import integer_parts
    from attnlab.storage import load

    q = tmp_path / "q"
    assert cli(capsys, "quantize", "--model", translation_run.path, "--bits", "8",
               "--out", q).code == 0
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        args = argparse.Namespace(model=str(q), adapter=None, command="translate",
                                  precision=precision, device="cpu")
        assert integer_parts(load_for(args, "encoder-decoder")[0].model) == (8, dtype)
    sentences = ["three hundred and twelve", "forty one"]
    r = cli(capsys, "translate", "--model", q, "--precision", "fp32", "--device", "cpu",
            *sentences)
    assert r.code == 0, r.err
    loaded = load(q)
    loaded.model.float()
    with torch.no_grad():
        expected = translate(loaded.model, loaded.tokenizers["source"],
                             loaded.tokenizers["target"], sentences)
    assert r.out.splitlines() == expected
