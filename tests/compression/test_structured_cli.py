"""``attnlab prune --ffn`` and ``--layers`` on a decoder-only language model and a translator:
the folders they write load (``attnlab.load``), generate and translate as the original model
with the dropped channels' W₂ columns zeroed, or as a plain loop over the layers that stay;
the layers dropped are those of least importance computed sentence by sentence, without
padding; bad input is one line and exit code 2."""

import copy
import re

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model, load
from attnlab.compression.structured import feedforwards
from attnlab.generation.decode import generate
from attnlab.generation.seq2seq import greedy_decode, translate
from attnlab.storage import save_model_dir
from attnlab.tokenizers import CharTokenizer
from tests.cli.helpers import assert_bad_input, cli
from tests.compression.test_structured import loop_hidden, numpy_kept

TEXT = "to be or not to be, that is the question. whether tis nobler in the mind. " * 6
SOURCES = ["one two three", "four", "twenty-one", "nine hundred", "seven", "eleven twelve"]


def randomised(model):
    """Weights large enough for a random model's greedy text to vary (at initialisation it
    repeats one character), biases and gains away from 0 and 1."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(std=0.3)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A 3-layer character GPT and a 2+2-layer translator (character tokenizers), saved."""
    root = tmp_path_factory.mktemp("structured")
    tok = CharTokenizer.train([TEXT])
    config = ModelConfig.from_preset("gpt-mini", vocab_size=tok.vocab_size, d_model=64,
                                     n_heads=4, d_ff=128, n_decoder_layers=3, max_len=64,
                                     dropout=0.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    torch.manual_seed(0)
    lm = randomised(build_model(config))
    with torch.no_grad():  # tied: the special tokens score 0, below the characters' best
        lm.embed.weight[:4] = 0
    src, tgt = CharTokenizer.train(SOURCES), CharTokenizer.train(["zwei drei vier"])
    config = ModelConfig.from_preset("tiny", vocab_size=src.vocab_size,
                                     tgt_vocab_size=tgt.vocab_size, tie_embeddings=False,
                                     d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2,
                                     n_decoder_layers=2, max_len=64, dropout=0.0)
    translator = randomised(build_model(config))
    (root / "text.txt").write_text(TEXT)
    (root / "sources.txt").write_text("\n".join(SOURCES) + "\n")
    return {
        "lm": (save_model_dir(root / "lm", lm, lm.config, {"text": tok.to_dict()}), lm, tok),
        "translator": (save_model_dir(root / "tr", translator, translator.config,
                                      {"source": src.to_dict(), "target": tgt.to_dict()}),
                       translator, (src, tgt)),
        "text": root / "text.txt", "sources": root / "sources.txt",
    }


def zeroed(model, fraction_kept: int):
    """``model`` with the W₂ columns of the channels numpy does not keep set to zero."""
    reference = copy.deepcopy(model)
    for ffn in feedforwards(reference).values():
        dropped = np.setdiff1d(np.arange(ffn.w2.in_features), numpy_kept(ffn, fraction_kept))
        with torch.no_grad():
            ffn.w2.weight[:, torch.from_numpy(dropped)] = 0
    return reference


def generated(capsys, folder, prompt="to be"):
    r = cli(capsys, "generate", "--model", folder, "--prompt", prompt, "--max-new-tokens", "12",
            "--ignore-eos", "--device", "cpu", "--precision", "fp32", "--quiet")
    assert r.code == 0, r.err
    return r.out


def greedy_text(model, tok, prompt="to be"):
    with torch.no_grad():
        ids = generate(model, torch.tensor([tok.encode(prompt)]), 12)
    return tok.decode(ids[0].tolist()) + "\n"


def translated(capsys, folder):
    r = cli(capsys, "translate", "--model", folder, *SOURCES, "--device", "cpu", "--precision",
            "fp32", "--quiet")
    assert r.code == 0, r.err
    return r.out


def test_ffn_on_a_language_model(folders, tmp_path, capsys):
    folder, model, tok = folders["lm"]
    r = cli(capsys, "prune", "--model", folder, "--ffn", "0.25", "--out", tmp_path / "p")
    assert r.code == 0, r.err
    assert "removed 32 of the 128 channels of each of 3 feed-forward layers" in r.out
    loaded = load(tmp_path / "p")
    assert loaded.config.d_ff == 96
    assert loaded.config.extra["pruned"] == [{"ffn": 0.25, "d_ff": [128, 96]}]
    reference = zeroed(model, 96)
    ids = torch.tensor([tok.encode("whether tis nobler")])
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids), reference(ids), atol=1e-5)
    assert generated(capsys, tmp_path / "p") == greedy_text(reference, tok)
    assert greedy_text(reference, tok) != greedy_text(model, tok)  # the channels mattered


def test_ffn_on_a_translator(folders, tmp_path, capsys):
    folder, model, (src, tgt) = folders["translator"]
    r = cli(capsys, "prune", "--model", folder, "--ffn", "0.5", "--out", tmp_path / "p")
    assert r.code == 0, r.err
    assert "of each of 4 feed-forward layers" in r.out and "d_ff 128 -> 64" in r.out
    loaded = load(tmp_path / "p")
    assert loaded.config.d_ff == 64
    reference = zeroed(model, 64)
    ids = torch.tensor([src.encode("twenty-one", add_eos=True)])
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids, ids[:, :4] % 10), reference(ids, ids[:, :4] % 10),
                              atol=1e-5)
    expected = translate(reference, src, tgt, SOURCES)
    assert translated(capsys, tmp_path / "p") == "".join(t + "\n" for t in expected)
    assert expected != translate(model, src, tgt, SOURCES)


def printed_scores(out: str) -> dict[str, list[float]]:
    return {stack: [float(v) for v in re.findall(r"\d+: ([\d.]+)", rest)]
            for stack, rest in re.findall(r"^  (\w+): (.*)$", out, re.M)}


def test_layers_of_a_language_model(folders, tmp_path, capsys):
    folder, model, tok = folders["lm"]
    r = cli(capsys, "prune", "--model", folder, "--layers", "1", "--data", folders["text"],
            "--block", "32", "--batch", "2", "--batches", "3", "--out", tmp_path / "p")
    assert r.code == 0, r.err
    # the windows the command reads, by hand: 32 tokens each, 6 of them
    ids = torch.tensor(tok.encode(TEXT))
    windows = torch.stack([ids[s : s + 32] for s in range(0, len(ids) - 32, 32)])[:6]
    with torch.no_grad():
        full = loop_hidden(model, windows).flatten(0, 1).numpy()
        expected = []
        for i in range(3):
            skip = loop_hidden(model, windows, {("blocks", i)}).flatten(0, 1).numpy()
            expected.append(np.linalg.norm(full - skip) / np.linalg.norm(full))
    assert printed_scores(r.out)["blocks"] == pytest.approx(expected, abs=1e-4)
    dropped = int(np.argmin(expected))
    assert f"{dropped}: {expected[dropped]:.4f} (removed)" in r.out
    loaded = load(tmp_path / "p")
    assert loaded.config.n_decoder_layers == 2
    assert loaded.config.extra["pruned"] == [{"layers": {"blocks": [dropped]}}]
    with torch.no_grad():
        assert torch.allclose(loaded.model(windows[:2]), model.lm_head(
            loop_hidden(model, windows[:2], {("blocks", dropped)})), atol=1e-5)
    assert generated(capsys, tmp_path / "p") == greedy_text(loaded.model, tok)


def ending(model):
    """greedy_decode, with each translation ended (eos, then pad) after as many tokens as its
    source has real ones: a random model's translations run to the limit, so without this the
    padding after an end, which the importance must leave out, would not be tested."""
    def decode(m, src, max_len=None, **kw):
        out = greedy_decode(m, src, max_len, **kw)
        for row, n in enumerate((src != model.config.pad_id).sum(1).tolist()):
            out[row, n] = model.config.eos_id
            out[row, n + 1 :] = model.config.pad_id
        return out

    return decode


def test_layers_of_a_translator_rank_both_stacks(folders, tmp_path, capsys, monkeypatch):
    """The command batches the sentences with padding; the reference runs each alone, on its
    own translation (at most 50 tokens more than the longest source) up to its end."""
    folder, model, (src, tgt) = folders["translator"]
    with monkeypatch.context() as patch:
        patch.setattr("attnlab.generation.seq2seq.greedy_decode", ending(model))
        r = cli(capsys, "prune", "--model", folder, "--layers", "2", "--data",
                folders["sources"], "--batch", "4", "--out", tmp_path / "p")
    assert r.code == 0, r.err
    pairs = []
    longest = max(len(src.encode(line, add_eos=True)) for line in SOURCES) + 50
    with torch.no_grad():
        for line in SOURCES:
            ids = torch.tensor([src.encode(line, add_eos=True)])
            out = ending(model)(copy.deepcopy(model), ids, max_len=longest)[0]
            ends = (out == model.config.eos_id).nonzero()
            pairs.append((ids, out[: int(ends[0]) + 1][None]))

        def hidden(skip=()):
            return np.concatenate([loop_hidden(model, p, skip)[0].numpy() for p in pairs])

        full = hidden()
        expected = {stack: [np.linalg.norm(full - hidden({(stack, i)})) / np.linalg.norm(full)
                            for i in range(2)] for stack in ("encoder", "decoder")}
    printed = printed_scores(r.out)
    for stack in expected:
        assert printed[stack] == pytest.approx(expected[stack], abs=1e-4), stack
    # each stack keeps one of its two layers: the lesser of each goes
    drop = {stack: [int(np.argmin(v))] for stack, v in expected.items()}
    loaded = load(tmp_path / "p")
    assert (loaded.config.n_encoder_layers, loaded.config.n_decoder_layers) == (1, 1)
    assert loaded.config.extra["pruned"] == [{"layers": drop}]
    skip = {(stack, v[0]) for stack, v in drop.items()}
    ids, out = pairs[0]
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids, out), model.lm_head(loop_hidden(model, (ids, out),
                                                                            skip)), atol=1e-5)
    expected_text = translate(loaded.model, src, tgt, SOURCES)
    assert translated(capsys, tmp_path / "p") == "".join(t + "\n" for t in expected_text)


@pytest.mark.parametrize("model, extra, message", [
    ("lm", ("--ffn", "0"), "--ffn must be a share of the feed-forward channels in (0, 1)"),
    ("lm", ("--ffn", "1"), "in (0, 1), got 1.0"),
    ("lm", ("--ffn", "1.5"), "in (0, 1), got 1.5"),
    ("lm", ("--ffn", "0.5", "--layers", "1"), "give one of --heads, --ffn, --layers"),
    ("lm", ("--layers", "1"), "--layers ranks layers by their importance on data: give --data"),
    ("lm", ("--layers", "3", "--data", "TEXT"), "--layers 3: the model has 3 layers (3 in "
                                                "blocks) and the stack keeps one, so 1 to 2"),
    ("lm", ("--layers", "0", "--data", "TEXT"), "so 1 to 2 can go"),
    ("translator", ("--layers", "3", "--data", "TEXT"), "4 layers (2 in encoder, 2 in decoder)"),
])
def test_bad_structured_prune_arguments(folders, tmp_path, capsys, model, extra, message):
    extra = [str(folders["text"]) if e == "TEXT" else e for e in extra]
    r = cli(capsys, "prune", "--model", folders[model][0], *extra, "--out", tmp_path / "p")
    assert_bad_input(r, message)
    assert not (tmp_path / "p").exists()
