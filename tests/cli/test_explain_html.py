"""``explain --html`` with the probe flags (``--lens``, ``--ablate``, ``--patch-from``,
``--all-layers``): the terminal prints the flags' tables, the page carries the walkthrough, the
views, the output, the lens and the ablations, as the plain ``explain --html`` writes them.
The page's contents against the model: tests/explain/test_html_page.py."""

import json
import re

from attnlab.explain import load_subject_model, make_subject
from attnlab.explain.lens import logit_lens
from attnlab.explain.probe import sentence_probe
from attnlab.explain.seq2seq import walk_sentence
from tests.cli.helpers import assert_bad_input, cli, not_a_folder

SENTENCE = "the cat sat"


def embedded(page) -> dict:
    text = page.read_text()
    return json.loads(re.search(r'id="data">(.*?)</script>', text, re.S).group(1))


def test_lens_and_ablate_with_html_print_their_tables_and_write_the_page(capsys, tmp_path):
    page = tmp_path / "page.html"
    r = cli(capsys, "explain", SENTENCE, "--lens", "--ablate", "cross.1.2", "--html", page)
    assert r.code == 0, r.err
    assert "logit lens:" in r.out and "ablated: head cross.1.2" in r.out
    assert f"HTML page: {page} (its walkthrough: " in r.out
    data = embedded(page)
    assert [v["key"] for v in data["views"]] == ["encoder", "decoder", "cross"]
    m = load_subject_model(None, [SENTENCE])  # the same random tiny model (seed 0)
    lens = logit_lens(sentence_probe(m.model, m.tokenizer, SENTENCE, None, m.target_tokenizer))
    assert data["lens"]["layers"] == lens.layers
    assert [[round(p, 3) for p in row] for row in data["lens"]["p"]] == \
        [[round(float(p), 3) for p in row] for row in lens.top_probs[..., 0]]
    w, _ = walk_sentence(make_subject(m.model, m.tokenizer, SENTENCE, m.label), 0, 0, None,
                         None, None, m.target_tokenizer)
    assert data["output"]["chosen"] == w.stage("output: chosen token").value[0]
    assert len(data["ablation"]["rows"]) == 6  # encoder, decoder, cross: 2 layers each


def test_html_with_a_probe_flag_refuses_a_layer_before_any_table(capsys, tmp_path):
    r = cli(capsys, "explain", SENTENCE, "--lens", "--layer", "7", "--html",
            tmp_path / "page.html")
    assert_bad_input(r, "--layer 7", while_running=True)  # as the plain explain
    assert "logit lens" not in r.out and not (tmp_path / "page.html").exists()


def test_html_with_a_probe_flag_that_cannot_be_written_is_named(capsys, tmp_path):
    page = not_a_folder(tmp_path).with_suffix(".html")
    r = cli(capsys, "explain", SENTENCE, "--lens", "--html", page)
    assert_bad_input(r, "--html", str(page.parent))
    assert r.out == "" and len(r.err.splitlines()) == 1  # refused before a model is announced
