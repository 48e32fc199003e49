"""One self-contained HTML page (no network, no external files): the walkthrough text and an
interactive attention view — choose a layer and a head; hover a token to see where it attends
and with what weight. The page's state can also be set from the address
(``page.html#layer=1&head=2&token=3``), which is how the browser test drives it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from attnlab.explain.report import format_text
from attnlab.explain.walkthrough import Walkthrough

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 70em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.8em; }
#tokens span { display: inline-block; padding: 0.2em 0.45em; margin: 0.15em; cursor: default;
  border: 1px solid #bbb; border-radius: 4px; font-family: monospace; }
#tokens span.focus { outline: 2px solid #d33; }
table#heatmap { border-collapse: collapse; font-family: monospace; font-size: 0.8em; }
#heatmap td, #heatmap th { padding: 0.3em 0.45em; text-align: center; }
#heatmap th { font-weight: normal; color: #555; }
.controls label { margin-right: 1em; }
"""

_SCRIPT = """
const data = JSON.parse(document.getElementById('data').textContent);
const layerSel = document.getElementById('layer'), headSel = document.getElementById('head');
let focusToken = null;
data.weights.forEach((_, l) => layerSel.add(new Option('layer ' + l, l)));
data.weights[0].forEach((_, h) => headSel.add(new Option('head ' + h, h)));
function shade(w) { return 'rgba(30, 90, 200, ' + (0.08 + 0.92 * w).toFixed(3) + ')'; }
function current() { return data.weights[+layerSel.value][+headSel.value]; }
function render() {
  const w = current();
  document.getElementById('view-title').textContent =
    'layer ' + layerSel.value + ' · head ' + headSel.value;
  const table = document.getElementById('heatmap');
  table.innerHTML = '';
  const top = table.insertRow();
  top.appendChild(document.createElement('th'));
  data.tokens.forEach(t => { const th = document.createElement('th');
    th.textContent = t; top.appendChild(th); });
  w.forEach((row, i) => {
    const tr = table.insertRow();
    const th = document.createElement('th'); th.textContent = data.tokens[i]; tr.appendChild(th);
    row.forEach((x, j) => { const td = tr.insertCell(); td.textContent = x.toFixed(2);
      td.dataset.weight = x; td.style.background = shade(x);
      td.style.color = x > 0.55 ? 'white' : 'black'; });
  });
  showFocus();
}
function showFocus() {
  const spans = document.querySelectorAll('#tokens span');
  const info = document.getElementById('focus');
  if (focusToken === null) {
    spans.forEach(s => { s.style.background = ''; s.classList.remove('focus'); });
    info.textContent = 'Hover a token to see where it attends.';
    return;
  }
  const row = current()[focusToken];
  spans.forEach((s, j) => { s.style.background = shade(row[j]);
    s.classList.toggle('focus', j === focusToken); });
  const ranked = row.map((x, j) => [x, j]).sort((a, b) => b[0] - a[0]);
  info.textContent = '"' + data.tokens[focusToken] + '" attends to: ' +
    ranked.map(([x, j]) => data.tokens[j] + ' ' + x.toFixed(3)).join(', ');
}
const tokenRow = document.getElementById('tokens');
data.tokens.forEach((t, i) => { const s = document.createElement('span'); s.textContent = t;
  s.addEventListener('mouseenter', () => { focusToken = i; showFocus(); });
  tokenRow.appendChild(s); });
layerSel.addEventListener('change', render);
headSel.addEventListener('change', render);
layerSel.value = data.layer; headSel.value = data.head;  // the walkthrough's, unless asked
function fromAddress() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has('layer')) layerSel.value = p.get('layer');
  if (p.has('head')) headSel.value = p.get('head');
  if (p.has('token')) focusToken = +p.get('token');
  render();
}
window.addEventListener('hashchange', fromAddress);
fromAddress();
"""


def write_html(w: Walkthrough, path: str | Path, compare: dict | None = None,
               dims: int = 6) -> Path:
    """Write the page for walkthrough ``w`` (every layer's and head's weights included)."""
    weights = [[[[round(float(x), 4) for x in row] for row in head] for head in layer]
               for layer in w.own.weights]  # (layers, heads, seq, seq)
    data = {"tokens": w.subject.tokens, "weights": weights, "layer": w.layer, "head": w.head}
    text = format_text(w, dims, compare)
    blob = json.dumps(data).replace("</", "<\\/")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnlab explain</title>
<style>{_STYLE}</style></head><body>
<h1>attnlab explain: {html.escape(w.subject.title)}</h1>
<p>Model: {html.escape(w.subject.label)}. Attention weights of every layer and head, from the
model's own forward pass.</p>
<div class="controls"><label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label></div>
<h2 id="view-title"></h2>
<div id="tokens"></div>
<p id="focus"></p>
<table id="heatmap"></table>
<p>Rows: the attending token (query); columns: the attended token (key). Each row sums to 1.</p>
<h2>Walkthrough of layer {w.layer}, head {w.head}</h2>
<pre id="walkthrough">{html.escape(text)}</pre>
<script type="application/json" id="data">{blob}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
