"""Longformer: random-weight transformers models (each supported head, a window per layer)
saved locally, loaded through attnlab.load, compared on padded batches at lengths that are and
are not multiples of the window, with and without global tokens; and written back."""

import json

import pytest
import torch
import transformers

from attnlab import ModelConfig, load, save_pretrained
from attnlab.errors import BadInput

VOCAB = 90
PAD, CLS, SEP = 1, 0, 2
# the largest window is 8: 13 is padded to 16, 16 is not padded (transformers
# needs each window to divide the largest, and W ≥ 4)
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=40, attention_window=[4, 8, 4],
             type_vocab_size=1, num_labels=3)
CLASSES = ["LongformerModel", "LongformerForMaskedLM", "LongformerForSequenceClassification",
           "LongformerForTokenClassification", "LongformerForQuestionAnswering"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each class once, its weights random (the global projections differ from the others)."""
    made = {}
    for cls in CLASSES:
        torch.manual_seed(0)
        labels = 2 if cls.endswith("QuestionAnswering") else 3  # start and end
        config = transformers.LongformerConfig(**{**SHAPE, "num_labels": labels})
        model = getattr(transformers, cls)(config).eval()
        path = tmp_path_factory.mktemp(cls)
        model.save_pretrained(path)
        made[cls] = (model, path)
    return made


def inputs(n):
    """Three rows, two padded: <s> first, a question closed by </s></s> (QA finds it), </s>
    last; pad ids where the mask is 0 (positions are counted from the ids)."""
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(5, VOCAB, (3, n), generator=g)
    mask = torch.ones_like(ids)
    lengths = [n, n - 4, 7]
    for row, length in enumerate(lengths):
        mask[row, length:] = 0
        ids[row, length:] = PAD
        ids[row, [0, 3, 4, length - 1]] = torch.tensor([CLS, SEP, SEP, SEP])
    glob = torch.zeros_like(ids)
    glob[0, [0, 5, n - 2]] = 1  # three global tokens, inside others' bands
    glob[1, 1] = 1
    return ids, mask, glob  # row 2 has no global token


def outputs(out) -> list[torch.Tensor]:
    if isinstance(out, tuple):
        return list(out)
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "start_logits"):
        return [out.start_logits, out.end_logits]
    return [out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits]


@pytest.mark.parametrize("with_global", [False, True])
@pytest.mark.parametrize("n", [13, 16])
@pytest.mark.parametrize("cls", CLASSES)
def test_attnlab_load_gives_transformers_numbers(folders, cls, n, with_global):
    theirs, path = folders[cls]
    ours = load(path).model
    ids, mask, glob = inputs(n)
    # without a mask each head has transformers' default: none, [CLS] (classification) or
    # the question (QA)
    glob = glob if with_global else None
    with torch.no_grad():
        expected = outputs(theirs(input_ids=ids, attention_mask=mask,
                                  global_attention_mask=glob))
        got = outputs(ours(ids, None, mask, global_attention_mask=glob))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_global_projections_and_windows_are_read(folders):
    theirs, path = folders["LongformerModel"]
    model = load(path).model
    layer = model.encoder.layers[1].self_attn
    assert layer.window == 8 and model.config.attention_windows == [4, 8, 4]
    hf = theirs.encoder.layer[1].attention.self
    assert torch.equal(layer.k_global.weight, hf.key_global.weight)
    assert not torch.equal(layer.k_global.weight, layer.k_proj.weight)
    assert model.config.reads_long_documents


@pytest.mark.parametrize("cls", ["LongformerModel", "LongformerForMaskedLM",
                                 "LongformerForQuestionAnswering"])
def test_written_back_transformers_reads_the_same_model(folders, tmp_path, cls):
    _, path = folders[cls]
    ours = load(path).model
    out = save_pretrained(ours, tmp_path / "back")
    assert json.loads((out / "config.json").read_text())["attention_window"] == [4, 8, 4]
    again = getattr(transformers, cls).from_pretrained(out).eval()
    ids, mask, glob = inputs(13)
    with torch.no_grad():
        for a, b in zip(outputs(again(input_ids=ids, attention_mask=mask,
                                      global_attention_mask=glob)),
                        outputs(ours(ids, None, mask, global_attention_mask=glob)), strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_roberta_writer_refuses_a_window(tmp_path):
    c = ModelConfig(arch="encoder", vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64,
                    n_encoder_layers=2, n_decoder_layers=0, positional="learned", max_len=40,
                    norm_eps=1e-12, scale_embeddings=False, type_vocab_size=1,
                    embedding_norm=True, activation="gelu", position_offset=2, pad_id=1,
                    attention_window=4, extra={"hf_model_type": "roberta"})
    from attnlab import build_model

    with pytest.raises(BadInput, match="attention_window=4 has no RobertaModel equivalent"):
        save_pretrained(build_model(c), tmp_path / "r")


def test_an_odd_window_in_config_json_is_one_line(folders, tmp_path):
    _, path = folders["LongformerModel"]
    bad = tmp_path / "bad"
    bad.mkdir()
    hf = json.loads((path / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**hf, "attention_window": [4, 7, 4]}))
    (bad / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(BadInput, match=r"attention_window=\[4, 7, 4\]"):
        load(bad)


@pytest.mark.parametrize("window", [512, [512, 256] * 6])
def test_the_preset_counts_transformers_parameters(window):
    """longformer-base against LongformerModel(LongformerConfig()), on the meta device: the
    global projections are counted, from a built model and from the config alone."""
    from attnlab import build_model, count_parameters

    config = ModelConfig.from_preset("longformer-base", attention_window=window)
    with torch.device("meta"):
        ours = build_model(config)
        theirs = transformers.LongformerModel(transformers.LongformerConfig(
            vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1,
            attention_window=window))
    assert count_parameters(ours) == count_parameters(config) == theirs.num_parameters()


def test_windows_are_refused_for_a_model_that_reads_the_whole_document(folders, tmp_path,
                                                                       capsys):
    """``--pool`` cuts a long text into windows; a Longformer reads it whole, so asking for
    both is one line and exit 2 (classify and train classify), before any window is cut."""
    import shutil

    from attnlab.tokenizers import WordPieceTokenizer
    from tests.cli.helpers import assert_bad_input, cli

    folder = tmp_path / "longformer"
    shutil.copytree(folders["LongformerForSequenceClassification"][1], folder)
    text = tmp_path / "corpus.txt"
    text.write_text("a long document about cats and dogs and birds\n" * 20)
    tok = WordPieceTokenizer.train([text], vocab_size=VOCAB)
    tok.backend.save(str(folder / "tokenizer.json"))
    assert load(folder).config.reads_long_documents
    r = cli(capsys, "classify", "--model", folder, "--pool", "max", "cats and dogs")
    assert_bad_input(r, "--pool", "Longformer", while_running=True)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"cats {i}", "label": str(i % 2)}) + "\n"
                            for i in range(20)))
    r = cli(capsys, "train", "classify", "--data", data, "--text-field", "text",
            "--label-field", "label", "--init", folder, "--pool", "mean",
            "--steps", "1", "--out", tmp_path / "run", "--device", "cpu")
    assert_bad_input(r, "--pool", "Longformer", while_running=True)
