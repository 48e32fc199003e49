"""``attnlab evaluate lm``: perplexity of a text file, checked against transformers.

The reference is Hugging Face's strided perplexity written out here with transformers' own
model and tokenizer on the same folder: windows of ``block`` tokens every ``stride``, the
tokens earlier windows scored set to -100 in the labels, the loss weighted by the tokens each
window scores. Two families (GPT-2 with learned positions, Llama with RoPE and grouped-query
attention), saved by attnlab as HF folders; their ``config.json`` and weights are what
transformers reads.
"""

import math
import re

import pytest
import torch

from attnlab import ModelConfig, build_model, load, save_pretrained
from attnlab.cpu import for_decoding
from attnlab.generation.likelihood import rolling_nll
from attnlab.storage import save_model_dir
from attnlab.tokenizers import BPETokenizer
from tests.cli.helpers import assert_bad_input, cli
from tests.perplexity import strided_nll

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\n"
        "Resolved. resolved.\n\n") * 4
PERPLEXITY = re.compile(r"^perplexity: (\d+\.\d{4})$")


@pytest.fixture(scope="module", params=["gpt-mini", "llama-mini"])
def folders(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    tok = BPETokenizer.train([TEXT] * 3, vocab_size=200)
    extra = {"num_kv_heads": 2} if request.param == "llama-mini" else {}
    config = ModelConfig.from_preset(request.param, vocab_size=tok.vocab_size, d_model=32,
                                     n_heads=4, d_ff=64, n_decoder_layers=2, max_len=64,
                                     pad_id=0, unk_id=1, bos_id=2, eos_id=3, **extra)
    torch.manual_seed(0)
    model = build_model(config)
    save_model_dir(root / "run", model, config, {"text": tok.to_dict()})
    save_pretrained(model, root / "hf")
    tok.save_hf(root / "hf" / "tokenizer.json")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    return root


def transformers_perplexity(folder, text: str, block: int, stride: int) -> tuple[float, int]:
    """Hugging Face's strided recipe, with transformers' model and tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = torch.tensor([Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids])
    nll, n = strided_nll(model, ids, block, stride)
    return math.exp(nll / n), ids.shape[1]


def perplexity(out: str) -> float:
    last = out.strip().splitlines()[-1]
    assert PERPLEXITY.match(last), last
    return float(PERPLEXITY.match(last).group(1))


@pytest.mark.parametrize("block, stride, batch", [(64, 32, 1), (24, 16, 3)])
def test_equals_transformers_strided_perplexity(capsys, folders, block, stride, batch):
    expected, n_tokens = transformers_perplexity(folders / "hf", TEXT, block, stride)
    assert n_tokens > 3 * block  # several windows
    for model in (folders / "run", folders / "hf"):
        r = cli(capsys, "evaluate", "lm", "--model", model, "--text", folders / "text.txt",
                "--block", block, "--stride", stride, "--batch", batch,
                "--device", "cpu", "--precision", "fp32")
        assert r.code == 0, r.err
        assert f"{n_tokens:,} tokens" in r.out and f"scored {n_tokens - 1:,} tokens" in r.out
        assert perplexity(r.out) == pytest.approx(expected, rel=1e-4)  # the issue asks 0.1%


def test_default_window_is_the_models_context(capsys, folders):
    expected, _ = transformers_perplexity(folders / "hf", TEXT, 64, 32)
    r = cli(capsys, "evaluate", "lm", "--model", folders / "run", "--text", folders / "text.txt",
            "--device", "cpu", "--precision", "fp32")
    assert r.code == 0, r.err
    assert "windows of at most 64 tokens every 32" in r.out
    assert perplexity(r.out) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("bits, within", [(4, 0.02), (8, 0.005)])
def test_integer_weights_of_a_trained_model(capsys, char_lm, tmp_path, bits, within):
    """``--int4``/``--int8`` on a trained character model (tests/conftest.py::char_lm, its
    perplexity about 2 against a vocabulary of 33):

    - the printed perplexity is the library's strided NLL (``rolling_nll``, the same windows)
      of ``load(folder, int4=True)`` (or ``int8``) prepared as integer models are for decoding
      (``for_decoding``: the int8 output layer), within 1e-4;
    - it stays within ``within`` of the float model's (measured: 0.2% for int4, 0.03% int8);
    - it stays far below the vocabulary's size, what a model that knows nothing scores.

    On an untrained model the perplexity is about 1.006 × the vocabulary's size whatever the
    matrices hold, so a quantiser writing zeros or noise passed the second check there."""
    text = tmp_path / "text.txt"
    text.write_text(char_lm.text * 4, encoding="utf-8")
    args = ("evaluate", "lm", "--model", char_lm.folder, "--text", text, "--block", "64",
            "--stride", "32", "--device", "cpu")
    full = perplexity(cli(capsys, *args, "--precision", "fp32").out)
    r = cli(capsys, *args, f"--int{bits}")
    assert r.code == 0, r.err
    assert f"int{bits} weights, " in r.err
    loaded = load(char_lm.folder, int4=bits == 4, int8=bits == 8)
    nll, n = rolling_nll(for_decoding(loaded.model, "cpu", "bf16", integer=True),
                         loaded.tokenizer.encode(char_lm.text * 4), 64, 32)
    assert perplexity(r.out) == pytest.approx(math.exp(nll / n), rel=1e-4)
    assert perplexity(r.out) == pytest.approx(full, rel=within)
    vocabulary = loaded.tokenizer.vocab_size
    assert perplexity(r.out) < math.sqrt(vocabulary) < vocabulary  # log-perplexity < ½ log V


@pytest.mark.parametrize("extra, message", [
    (("--block", "65"), "--block 65 exceeds the model's context of 64"),
    (("--block", "16", "--stride", "16"), "1 <= --stride < --block"),
    (("--block", "1"), "--block >= 2"),
    (("--batch", "0"), "--batch must be >= 1"),
])
def test_bad_window_arguments(capsys, folders, extra, message):
    r = cli(capsys, "evaluate", "lm", "--model", folders / "run", "--text",
            folders / "text.txt", *extra)
    assert_bad_input(r, message)


def test_bad_text_files(capsys, folders, tmp_path):
    binary = tmp_path / "latin1.txt"
    binary.write_bytes("café".encode("latin-1"))
    short = tmp_path / "short.txt"
    short.write_text("", encoding="utf-8")
    for path, message in ((tmp_path / "missing.txt", "no such file"),
                          (binary, ":1: not UTF-8 text (byte 3: unexpected end of data)"),
                          (tmp_path, "a directory"), (short, "perplexity needs at least 2")):
        r = cli(capsys, "evaluate", "lm", "--model", folders / "run", "--text", path)
        assert_bad_input(r, str(path), message)


def test_an_encoder_decoder_model_is_refused(capsys, folders, tmp_path):
    config = ModelConfig.from_preset("tiny", vocab_size=20, max_len=16)
    folder = save_model_dir(tmp_path / "mt", build_model(config), config, {})
    r = cli(capsys, "evaluate", "lm", "--model", folder, "--text", folders / "text.txt",
            "--device", "cpu")
    assert_bad_input(r, str(folder), "not a language model")
