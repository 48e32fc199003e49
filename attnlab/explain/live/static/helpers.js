/* attnlab live explainer: the small helpers every page script shares as globals (page.html
 * loads this file first): DOM lookup and elements, number formats, the page's colour scale,
 * tables and bars.
 */
'use strict';

// --- small helpers ------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);
const clamp = (x, lo, hi) => Math.max(lo, Math.min(hi, x));
const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);
const short = (s, n = 14) => (s.length > n ? s.slice(0, n - 1) + '…' : s);
const copy = (x) => JSON.parse(JSON.stringify(x));

/** A number for reading: fixed digits, a real minus sign, ∞ spelled out. */
function fmt(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return '·';
  if (!Number.isFinite(x)) return x > 0 ? '∞' : '−∞';
  return x.toFixed(digits).replace('-', '−');
}
const sci = (x) => (x === null || x === undefined ? '–' : x.toExponential(1).replace('-', '−'));

/** White to blue as a weight goes from 0 to 1: the one scale of the page. */
const rgb = (w) => [225, 165, 55].map((d) => Math.round(255 - d * clamp(w, 0, 1)));
const shade = (w) => `rgb(${rgb(w)})`;
/** Signed values: blue above 0, red below, white at 0. */
const diverge = (x) => (x >= 0 ? shade(x)
  : `rgb(${[35, 195, 195].map((d) => Math.round(255 - d * clamp(-x, 0, 1)))})`);
const ink = (w) => (w > 0.55 ? 'white' : '#222');

/** An element with attributes (data-*, class, style, title; the rest as properties). */
function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (/^(data-|class$|style$|title$)/.test(k)) e.setAttribute(k, v); else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

/** A matrix as a table: column and row labels, cell(i, j) → {text, value, bg, dark}. */
function grid(t, cols, rows, cell) {
  t.replaceChildren();
  const head = t.insertRow();
  [''].concat(cols).forEach((c) => head.appendChild(el('th', {}, c)));
  rows.forEach((r, i) => {
    const tr = t.insertRow();
    tr.appendChild(el('th', {}, r));
    cols.forEach((_, j) => {
      const c = cell(i, j), td = tr.insertCell();
      td.textContent = c.text;
      if (c.value !== null && c.value !== undefined) td.dataset.value = c.value;
      if (c.bg) { td.style.background = c.bg; td.style.color = c.dark ? 'white' : '#222'; }
    });
  });
}

/** A list as a table: caption, header, then row(item, n) → {cells, attrs}; a cell is text or
 *  a ready <td>. */
function table(t, caption, headers, items, row) {
  t.replaceChildren();
  if (caption) t.appendChild(el('caption', {}, caption));
  const head = el('tr');
  headers.forEach((h) => head.appendChild(el('th', {}, h)));
  t.appendChild(head);
  items.forEach((item, n) => {
    const { cells, attrs = {} } = row(item, n), tr = el('tr', attrs);
    cells.forEach((c) => tr.appendChild(c instanceof Node ? c : el('td', {}, c)));
    t.appendChild(tr);
  });
  return t;
}

function bar(p) {
  const td = el('td', { class: 'bar' });
  td.appendChild(el('div', { style: `width:${(100 * p).toFixed(1)}%` }));
  return td;
}
