"""``attnlab train electra``: the run's report and folders, the discriminator and the generator
saved as transformers' ElectraForPreTraining and ElectraForMaskedLM with equal logits, a
classifier fine-tuned from the discriminator, ``--resume``, and bad input in one line. (The
loss, the gradients and learning: tests/training/test_electra.py.)"""

import json
import random

import pytest
import torch

from attnlab import load, save_pretrained
from tests.cli.conftest import CYCLE
from tests.cli.helpers import assert_bad_input, cli, cli_captured

transformers = pytest.importorskip("transformers")

SHAPE = ["--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--set",
         "embedding_size=16", "--set", "n_encoder_layers=2"]


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("electra")
    rng = random.Random(0)
    lines = [" ".join(CYCLE[(k + j) % len(CYCLE)] for j in range(6))
             for k in (rng.randrange(len(CYCLE)) for _ in range(200))]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")
    run = folder / "run"
    r = cli_captured("train", "electra", "--text", folder / "corpus.txt", "--preset",
                     "electra-small", *SHAPE, "--vocab-size", "60", "--steps", "2",
                     "--eval-every", "2", "--batch", "8", "--max-len", "16", "--out", run,
                     "--no-progress", "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    return folder, run, r


def test_train_electra_reports_the_discriminator_and_saves_both_models(electra_run):
    _, run, r = electra_run
    assert r.err == "", r.err
    assert "generator d_model 8, 1 heads, d_ff 16; loss MLM + 50·RTD" in r.out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2
    assert f"validation generator masked-LM loss {rows[-1]['val_loss']:.4f} after 2 steps" \
        in r.out
    line = next(x for x in r.out.splitlines() if x.startswith("discriminator on "))
    assert "validation tokens: accuracy" in line and "replaced" in line, line
    assert f"discriminator in {run / 'final'}, generator in {run / 'generator'}" in r.out
    assert (run / "checkpoints" / "step-00000002" / "model.safetensors").exists()
    disc, gen = load(run), load(run / "generator")  # the run means its discriminator
    assert (disc.config.head, disc.config.d_model, disc.config.embedding_size) == (
        "discriminator", 32, 16)
    assert (gen.config.head, gen.config.d_model, gen.config.n_heads, gen.config.d_ff) == (
        "mlm", 8, 1, 16)
    # the two folders hold one embedding table, trained by both losses
    assert torch.equal(disc.model.embed.weight, gen.model.embed.weight)
    assert torch.equal(disc.model.positional.weight, gen.model.positional.weight)


def test_both_models_load_in_transformers_with_equal_logits(electra_run, tmp_path):
    _, run, _ = electra_run
    disc, gen = load(run), load(run / "generator")
    save_pretrained(disc.model, tmp_path / "disc")
    save_pretrained(gen.model, tmp_path / "gen")
    theirs_d = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "disc").eval()
    theirs_g = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
    ids = torch.randint(5, disc.config.vocab_size, (2, 12),
                        generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    with torch.no_grad():
        ours = disc.model(ids, attention_mask=attention)
        got = theirs_d(ids, attention_mask=attention).logits
        assert (ours - got)[attention.bool()].abs().max() <= 1e-4
        ours = gen.model(ids, attention_mask=attention)
        got = theirs_g(ids, attention_mask=attention).logits
        assert (ours - got)[attention.bool()].abs().max() <= 1e-4
    assert torch.equal(theirs_d.electra.embeddings.word_embeddings.weight,
                       theirs_g.electra.embeddings.word_embeddings.weight)


def test_a_classifier_fine_tunes_from_the_discriminator(electra_run, tmp_path):
    """The discriminator has no pooler: train classify gives it a new one, and its
    replaced-token head is left behind."""
    folder, run, _ = electra_run
    rows = [{"id": str(i), "text": " ".join(CYCLE[(i + j) % 6 + 6 * (i % 2)] for j in range(5)),
             "label": ["a", "b"][i % 2]} for i in range(80)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli_captured("train", "classify", "--data", tmp_path / "data.jsonl", "--text-field",
                     "text", "--label-field", "label", "--init", run, "--steps", "2",
                     "--batch", "8", "--out", tmp_path / "cls", "--no-progress", "--device",
                     "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    model = load(tmp_path / "cls").model
    base = load(run).model
    assert model.config.head == "classify" and model.pooler is not None
    assert model.discriminator is None
    # the encoder started from the discriminator's weights (two steps move them only a little)
    assert torch.allclose(model.embed.weight, base.embed.weight, atol=0.01)


def test_resume_continues_the_pair(electra_run, tmp_path, capsys):
    folder, run, _ = electra_run
    import shutil

    shutil.copytree(run, tmp_path / "run")
    r = cli(capsys, "train", "electra", "--text", folder / "corpus.txt", "--preset",
            "electra-small", *SHAPE, "--vocab-size", "60", "--steps", "3", "--eval-every", "3",
            "--batch", "8", "--max-len", "16", "--out", tmp_path / "run", "--no-progress",
            "--device", "cpu", "--precision", "fp32", "--resume")
    assert r.code == 0, r.err
    assert "resumed from step 2" in r.out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert json.loads((tmp_path / "run" / "final" / "step.json").read_text())["step"] == 3


@pytest.mark.parametrize("flags,names", [
    (["--generator-size", "0"], ["--generator-size", "(0, 1]"]),
    (["--generator-size", "0.3", "--set", "n_heads=8"], ["--generator-size 0.3", "heads"]),
    (["--rtd-weight", "-1"], ["--rtd-weight"]),
    (["--preset", "gpt-mini"], ["--preset gpt-mini"]),
])
def test_bad_settings_are_one_line_errors(electra_run, capsys, tmp_path, flags, names):
    folder, _, _ = electra_run
    r = cli(capsys, "train", "electra", "--text", folder / "corpus.txt", "--preset",
            "electra-small", "--vocab-size", "60", "--steps", "1", "--out", tmp_path / "run",
            "--no-progress", "--device", "cpu", *flags)
    assert_bad_input(r, *names)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_missing_text_file_is_named(capsys, tmp_path):
    missing = tmp_path / "nope.txt"
    r = cli(capsys, "train", "electra", "--text", missing, "--out", tmp_path / "run",
            "--no-progress", "--device", "cpu")
    assert_bad_input(r, str(missing))
