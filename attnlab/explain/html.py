"""One self-contained HTML page (no network, no external files) for ``explain --html``:

- the attention views, each with layer and head pickers: the encoder's self-attention (a
  decoder-only model's masked self-attention), and for an encoder–decoder the decoder's masked
  self-attention and its cross-attention (target × source); hover a token to see where it
  attends and with what weight;
- the output stage's top candidates (p, logit) and the chosen token;
- the logit lens (layer × position: the top token and its probability);
- each head ablated alone (layer × head: the chosen token's probability);
- the walkthrough's text.

The data is gathered by :func:`attnlab.explain.page_data.page_data` and embedded as JSON; a
small script draws it. The page's state can also be set from the address
(``page.html#view=cross&layer=1&head=2&token=0``; without ``view``, the first view), which is
how the browser test drives it. Every table cell with a number carries it in ``data-value``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from attnlab.explain.page_data import page_data
from attnlab.explain.report import format_text
from attnlab.explain.walkthrough import Walkthrough

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 70em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.8em; }
.tokens span { display: inline-block; padding: 0.2em 0.45em; margin: 0.15em; cursor: default;
  border: 1px solid #bbb; border-radius: 4px; font-family: monospace; }
.tokens span.focus { outline: 2px solid #d33; }
table { border-collapse: collapse; font-family: monospace; font-size: 0.8em; }
td, th { padding: 0.3em 0.45em; text-align: center; }
th { font-weight: normal; color: #555; }
.controls label { margin-right: 1em; }
.note { color: #555; }
"""

_SCRIPT = """
const data = JSON.parse(document.getElementById('data').textContent);
const $ = id => document.getElementById(id);
const state = {view: data.views[0].key, layer: data.layer, head: data.head, token: null};
data.views.forEach(v => $('view').add(new Option(v.title, v.key)));
function shade(x) { return 'rgba(30, 90, 200, ' + (0.08 + 0.92 * x).toFixed(3) + ')'; }
// a table: column and row labels; cell(i, j) -> {text, value, shade} (value: data-value)
function grid(id, cols, rows, cell) {
  const table = $(id);
  table.innerHTML = '';
  const top = table.insertRow();
  top.appendChild(document.createElement('th'));
  cols.forEach(c => { const th = document.createElement('th'); th.textContent = c;
    top.appendChild(th); });
  rows.forEach((r, i) => {
    const tr = table.insertRow(), th = document.createElement('th');
    th.textContent = r; tr.appendChild(th);
    cols.forEach((_, j) => { const c = cell(i, j), td = tr.insertCell();
      td.textContent = c.text;
      if (c.value !== null && c.value !== undefined) td.dataset.value = c.value;
      if (c.title) td.title = c.title;
      if (c.shade !== undefined) { td.style.background = shade(c.shade);
        td.style.color = c.shade > 0.55 ? 'white' : 'black'; } });
  });
}
function note(id, part) { $(id).textContent = part.note || ''; return !part.note; }
function fill(sel, n, word, value) {
  sel.length = 0;
  for (let i = 0; i < n; i++) sel.add(new Option(word + ' ' + i, i));
  sel.value = value;
}
function spans(id, tokens, hover) {
  const row = $(id); row.innerHTML = '';
  tokens.forEach((t, i) => { const s = document.createElement('span'); s.textContent = t;
    if (hover) s.addEventListener('mouseenter', () => { state.token = i; showFocus(); });
    row.appendChild(s); });
}
function view() { return data.views.find(v => v.key === state.view) || data.views[0]; }
function current() { return view().weights[state.layer][state.head]; }
function render() {
  const v = view();
  state.view = v.key;
  state.layer = Math.max(0, Math.min(state.layer, v.weights.length - 1));
  state.head = Math.max(0, Math.min(state.head, v.weights[state.layer].length - 1));
  if (!(state.token >= 0 && state.token < v.rows.length)) state.token = null;
  $('view').value = v.key;
  fill($('layer'), v.weights.length, 'layer', state.layer);
  fill($('head'), v.weights[state.layer].length, 'head', state.head);
  $('view-title').textContent = v.title + ' · layer ' + state.layer + ' · head ' + state.head;
  $('view-note').textContent = v.note;
  const w = current();
  grid('heatmap', v.cols, v.rows, (i, j) => ({text: w[i][j].toFixed(2), value: w[i][j],
                                              shade: w[i][j]}));
  spans('tokens', v.rows, true);
  spans('keys', v.key === 'cross' ? v.cols : [], false);
  showFocus();
}
function showFocus() {
  const v = view(), cross = v.key === 'cross';
  const shown = document.querySelectorAll(cross ? '#keys span' : '#tokens span');
  document.querySelectorAll('#tokens span').forEach((s, j) =>
    s.classList.toggle('focus', j === state.token));
  if (state.token === null) {
    shown.forEach(s => { s.style.background = ''; });
    $('focus').textContent = 'Hover a token to see where it attends.';
    return;
  }
  const row = current()[state.token];
  shown.forEach((s, j) => { s.style.background = shade(row[j]); });
  const ranked = row.map((x, j) => [x, j]).sort((a, b) => b[0] - a[0]);
  $('focus').textContent = '"' + v.rows[state.token] + '" attends to: ' +
    ranked.map(([x, j]) => v.cols[j] + ' ' + x.toFixed(3)).join(', ');
}
$('view').addEventListener('change', () => { state.view = $('view').value; render(); });
$('layer').addEventListener('change', () => { state.layer = +$('layer').value; render(); });
$('head').addEventListener('change', () => { state.head = +$('head').value; render(); });
function fromAddress() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has('view')) state.view = p.get('view');
  if (p.has('layer')) state.layer = +p.get('layer');
  if (p.has('head')) state.head = +p.get('head');
  state.token = p.has('token') ? +p.get('token') : null;
  render();
}
window.addEventListener('hashchange', fromAddress);
fromAddress();

const out = data.output;
if (note('output-note', out)) {
  grid('output', out.cols, out.rows, (i, j) => ({text: out.values[i][j].toFixed(4),
    value: out.values[i][j], shade: j === 0 ? out.values[i][j] : undefined}));
  $('chosen').textContent = 'Chosen: ' + out.chosen + ' (' + out.how + ')';
  if (out.translation !== undefined) $('translation').textContent = 'Translation, token by ' +
    'token: ' + JSON.stringify(out.translation) + (out.translate === null ? '' :
    ' (translate gives ' + JSON.stringify(out.translate) + ')');
}
const lens = data.lens;
if (note('lens-note', lens)) {
  $('lens-note').textContent = 'Each layer\\'s output through ' + lens.parts.join(' → ') +
    '; the model predicts: ' + lens.final.join(' ') + '. Check: ' + lens.check.name +
    ', max |Δ| = ' + lens.check.error.toExponential(2) +
    (lens.check.ok ? ' (ok).' : ' (FAILED).');
  grid('lens', lens.cols, lens.layers, (i, j) => ({text: lens.tokens[i][j] + ' ' +
    lens.p[i][j].toFixed(2), value: lens.p[i][j], shade: lens.p[i][j]}));
}
const abl = data.ablation;
if (note('ablation-note', abl)) {
  $('ablation-note').textContent = 'p(' + abl.chosen + ') at ' + abl.where + ' with that one ' +
    'head\\'s output (before W_O) set to zero; unablated: ';
  const base = document.createElement('span');
  base.id = 'ablation-before'; base.dataset.value = abl.before;
  base.textContent = abl.before.toFixed(4);
  $('ablation-note').appendChild(base);
  grid('ablation', abl.cols, abl.rows, (i, j) => { const p = abl.p[i][j];
    if (p === null) return {text: '·', value: null};
    return {text: p.toFixed(4), value: p, title: 'Δ = ' + (p - abl.before).toFixed(4),
            shade: Math.min(1, Math.abs(p - abl.before) / Math.max(abl.before, 1e-9))}; });
}
"""


def write_html(w: Walkthrough, path: str | Path, compare: dict | None = None, dims: int = 6,
               translation=None, target: str | None = None, target_tokenizer=None) -> Path:
    """Write the page for walkthrough ``w`` (every layer's and head's weights included);
    ``translation``, ``target`` and ``target_tokenizer``: an encoder–decoder walk's
    (:func:`~attnlab.explain.seq2seq.walk_sentence`)."""
    data = page_data(w, translation, target, target_tokenizer)
    text = format_text(w, dims, compare, translation)
    blob = json.dumps(data, allow_nan=False).replace("<", "\\u003c")  # no </script> inside
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnlab explain</title>
<style>{_STYLE}</style></head><body>
<h1>attnlab explain: {html.escape(w.subject.title)}</h1>
<p>Model: {html.escape(w.subject.label)}. Attention weights of every layer and head, from the
model's own forward pass.</p>
<div class="controls"><label>View <select id="view"></select></label>
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label></div>
<h2 id="view-title"></h2>
<div id="tokens" class="tokens"></div>
<div id="keys" class="tokens"></div>
<p id="focus"></p>
<table id="heatmap"></table>
<p id="view-note" class="note"></p>
<h2>The next token: the output probabilities</h2>
<p id="output-note" class="note"></p>
<table id="output"></table>
<p id="chosen"></p>
<p id="translation"></p>
<h2>Logit lens: the top token and its probability, layer × position</h2>
<p id="lens-note" class="note"></p>
<table id="lens"></table>
<h2>Ablation: each head alone set to zero, layer × head</h2>
<p id="ablation-note" class="note"></p>
<table id="ablation"></table>
<h2>Walkthrough of layer {w.layer}, head {w.head}</h2>
<pre id="walkthrough">{html.escape(text)}</pre>
<script type="application/json" id="data">{blob}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
