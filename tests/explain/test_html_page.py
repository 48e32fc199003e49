"""The HTML page of ``explain --html``: every attention view, the output probabilities, the
logit lens and the ablation table, read back from the JSON it embeds and from what a headless
browser draws, against the model's own tensors (its layers' ``need_weights`` attributes, its
logits, :func:`logit_lens`, :func:`ablate`)."""

import functools
import html
import json
import re

import pytest
import torch

from attnlab.explain import load_subject_model, make_subject
from attnlab.explain.html import write_html
from attnlab.explain.interventions import ablate, parse_heads
from attnlab.explain.lens import logit_lens
from attnlab.explain.output import piece, usable
from attnlab.explain.page_data import ablation
from attnlab.explain.probe import sentence_probe
from attnlab.explain.seq2seq import decoder_input, walk_sentence
from tests.explain.test_lens import gpt, word_tok
from tests.explain.test_pictures import BROWSER, dom

SOURCE, TARGET = "money in the bank grows", "money in"
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium on this machine (.ci/run "
                                                           "installs the Debian package)")


class Page:
    """A page written for one walk, with the references it is checked against."""

    def __init__(self, tmp, model, tok, tgt_tok, sentence, target, layer, head):
        self.model, self.tok, self.tgt_tok, self.target = model, tok, tgt_tok, target
        subject = make_subject(model, tok, sentence, "a test model")
        steps = 2 if hasattr(model, "decode") else None  # an encoder–decoder: 2 tokens more
        self.w, translation = walk_sentence(subject, layer, head, target, steps, None, tgt_tok)
        self.path = write_html(self.w, tmp / "page.html", None, 6, translation, target, tgt_tok)
        self.text = self.path.read_text()
        blob = re.search(r'<script type="application/json" id="data">(.*?)</script>', self.text,
                         re.S).group(1)
        self.data = json.loads(blob)
        self.probe = sentence_probe(model, tok, sentence, target, tgt_tok)
        self.ids = subject.ids

    def own_weights(self) -> dict[str, list[torch.Tensor]]:
        """Every attention's weights as the model's layers keep them after a need_weights pass
        (batch index dropped): {view key: [(heads, rows, cols) per layer]}."""
        m = self.model
        with torch.no_grad():
            if not hasattr(m, "decode"):  # decoder-only
                m(self.ids, need_weights=True)
                return {"decoder": [b.attn_weights[0] for b in m.blocks.layers]}
            tgt = decoder_input(m, self.tgt_tok, self.target)
            m(self.ids, tgt, need_weights=True)
        return {"encoder": [b.attn_weights[0] for b in m.encoder.layers],
                "decoder": [b.attn_weights[0] for b in m.decoder.layers],
                "cross": [b.cross_weights[0] for b in m.decoder.layers]}

    def logits(self) -> torch.Tensor:
        """The model's own scores at the last position, as a token may be chosen from them."""
        return usable(self.probe.forward()[-1].float(), self.model)

    @functools.cached_property
    def ablated(self) -> tuple[list[list[float]], float, int]:
        """p(the greedy pick) with each head alone ablated by :func:`ablate`, and unablated."""
        before = self.logits().softmax(-1)
        chosen = int(before.argmax())
        table = []
        for row in self.data["ablation"]["rows"]:
            n = len([p for p in self.data["ablation"]["p"][len(table)] if p is not None])
            table.append([float(usable(ablate(self.probe, parse_heads(f"{row}.{h}", self.probe))
                                       .after[-1].float(), self.model).softmax(-1)[chosen])
                          for h in range(n)])
        return table, float(before[chosen]), chosen


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    model, tok, _, _, tgt_tok = load_subject_model(None, [SOURCE])
    return Page(tmp_path_factory.mktemp("seq2seq"), model, tok, tgt_tok, SOURCE, TARGET, 1, 2)


@pytest.fixture(scope="module")
def decoder_only(tmp_path_factory):
    tok = word_tok()
    return Page(tmp_path_factory.mktemp("gpt"), gpt("gpt-mini"), tok, tok,
                "the capital of france is", None, 1, 2)


def close(a, b, tol=1e-4):
    """Nested lists of page numbers (5 significant digits) against a tensor or lists."""
    a = torch.tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=tol, atol=1e-6)


# --- the embedded JSON, without a browser ---------------------------------------------------
@pytest.mark.parametrize("which", ["seq2seq", "decoder_only"])
def test_page_json_equals_the_models_tensors(which, request):
    page = request.getfixturevalue(which)
    data, own = page.data, page.own_weights()
    assert [v["key"] for v in data["views"]] == list(own)
    for view in data["views"]:  # every layer and head of every attention
        assert len(view["weights"]) == len(own[view["key"]])
        for mine, theirs in zip(view["weights"], own[view["key"]], strict=True):
            close(mine, theirs)
        assert len(view["rows"]) == theirs.shape[1] and len(view["cols"]) == theirs.shape[2]
    if which == "seq2seq":
        cross = data["views"][2]
        assert cross["rows"] == page.probe.tokens and cross["cols"] == page.probe.source

    logits = page.logits()  # the output stage: the model's own softmax and its top candidates
    top = logits.softmax(-1).topk(len(data["output"]["rows"]))
    close([r[0] for r in data["output"]["values"]], top.values)
    close([r[1] for r in data["output"]["values"]], logits[top.indices])
    assert data["output"]["rows"] == [piece(page.tgt_tok, int(i)) for i in top.indices]
    assert data["output"]["chosen"] == piece(page.tgt_tok, int(logits.argmax()))

    lens = logit_lens(page.probe)  # the lens: top token and probability, layer × position
    close(data["lens"]["p"], lens.top_probs[..., 0])
    assert data["lens"]["tokens"] == [[page.probe.token_text(int(i)) for i in row]
                                      for row in lens.top_ids[..., 0]]
    assert data["lens"]["layers"] == lens.layers

    table, before, chosen = page.ablated  # each head ablated alone, by ablate()
    assert data["ablation"]["chosen"] == data["output"]["chosen"] == page.probe.token_text(chosen)
    close([[p for p in row if p is not None] for row in data["ablation"]["p"]], table)
    assert data["ablation"]["before"] == pytest.approx(before, rel=1e-4)
    assert data["ablation"]["before"] == pytest.approx(data["output"]["values"][0][0], rel=1e-4)


def test_the_page_is_self_contained(seq2seq):
    text = seq2seq.text
    assert "http://" not in text and "https://" not in text
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", text)  # nothing read from elsewhere
    assert "</script>" not in re.search(r'id="data">(.*?)</script>', text, re.S).group(1)
    walkthrough = html.unescape(re.search(r'<pre id="walkthrough">(.*?)</pre>', text,
                                          re.S).group(1))
    assert "cross-attention" in walkthrough and "the translation, token by token" in walkthrough


def test_too_many_heads_gives_a_note_not_a_table(seq2seq):
    n = 3 * 2 * 4  # encoder, decoder, cross: 2 layers of 4 heads each
    assert "rows" in ablation(seq2seq.probe, limit=n)
    assert "more than the 23" in ablation(seq2seq.probe, limit=n - 1)["note"]


# --- what the browser draws --------------------------------------------------------------------
def table(d: str, name: str) -> tuple[list[str], list[str], list[list[float | None]]]:
    """A drawn table: column labels, row labels, and each cell's data-value."""
    body = re.search(rf'<table id="{name}">(.*?)</table>', d, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    labels = lambda row: [html.unescape(t) for t in re.findall(r"<th>([^<]*)</th>", row)]  # noqa: E731
    cells = [[float(v) if v else None for v in re.findall(r'<td(?: data-value="([^"]*)")?', r)]
             for r in rows[1:]]
    return labels(rows[0])[1:], [labels(r)[0] for r in rows[1:]], cells


def title(d: str) -> str:
    return re.search(r'id="view-title">([^<]*)<', d).group(1)


@needs_browser
def test_seq2seq_page_in_headless_chromium(seq2seq):
    page, own = seq2seq, seq2seq.own_weights()
    cross = dom(page.path, "view=cross&layer=1&head=2&token=1")
    decoder = dom(page.path, "view=decoder&layer=0&head=3")
    encoder = dom(page.path, "layer=1&head=3&token=3")  # the address before views existed
    assert title(cross) == "cross-attention · layer 1 · head 2"
    cols, rows, cells = table(cross, "heatmap")
    assert (rows, cols) == (page.probe.tokens, page.probe.source)  # target × source
    close(cells, own["cross"][1][2])
    focus = html.unescape(re.search(r'id="focus">([^<]*)<', cross).group(1))
    assert focus.startswith(f'"{page.probe.tokens[1]}" attends to:')
    assert title(decoder) == "decoder masked self-attention · layer 0 · head 3"
    close(table(decoder, "heatmap")[2], own["decoder"][0][3])
    assert title(encoder) == "encoder self-attention · layer 1 · head 3"
    close(table(encoder, "heatmap")[2], own["encoder"][1][3])

    logits = page.logits()
    cols, rows, cells = table(cross, "output")
    top = logits.softmax(-1).topk(len(rows))
    assert cols == ["p", "logit"] and rows == [piece(page.tgt_tok, int(i)) for i in top.indices]
    close(cells, torch.stack([top.values, logits[top.indices]], -1))
    chosen = html.unescape(re.search(r'id="chosen">([^<]*)<', cross).group(1))
    assert chosen.startswith(f"Chosen: {piece(page.tgt_tok, int(logits.argmax()))} (")

    cols, rows, cells = table(cross, "lens")
    lens = logit_lens(page.probe)
    assert rows == lens.layers and cols == page.probe.tokens
    close(cells, lens.top_probs[..., 0])

    cols, rows, cells = table(cross, "ablation")
    expected, before, _ = page.ablated
    assert rows == ["encoder.0", "encoder.1", "decoder.0", "cross.0", "decoder.1", "cross.1"]
    close(cells, expected)
    drawn = re.search(r'id="ablation-before" data-value="([^"]*)"', cross).group(1)
    assert float(drawn) == pytest.approx(before, rel=1e-4)


@needs_browser
def test_decoder_only_page_in_headless_chromium(decoder_only):
    page, own = decoder_only, decoder_only.own_weights()
    d = dom(page.path, "layer=2&head=1&token=4")
    assert title(d) == "masked self-attention · layer 2 · head 1"
    cols, rows, cells = table(d, "heatmap")
    assert rows == cols == page.probe.tokens
    close(cells, own["decoder"][2][1])
    logits = page.logits()
    top = logits.softmax(-1).topk(len(table(d, "output")[1]))
    close(table(d, "output")[2], torch.stack([top.values, logits[top.indices]], -1))
    close(table(d, "lens")[2], logit_lens(page.probe).top_probs[..., 0])
    cols, rows, cells = table(d, "ablation")
    assert rows == ["0", "1", "2"] and cols == ["h0", "h1", "h2", "h3"]
    close(cells, page.ablated[0])
