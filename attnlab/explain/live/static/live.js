/* attnlab live explainer: the browser side of `attnlab explain --serve`.
 *
 * The server runs the model; the page asks it for one run at a time (POST /api/run) and draws
 * what comes back: attention (heatmap, lines, every head), the neuron view, the output
 * probabilities, interventions, the logit lens and the checked stages. The DOM ids and data
 * attributes are the ones the browser tests read. What the sampling controls change is
 * recomputed here, with no server call (`filter`).
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

// --- the page's state (window.attnlab.state, which the tests read) --------------------------
const S = {
  info: null,
  run: null,              // the current /api/run answer
  inputs: { sentence: '', target: null, digit: null, image: null, layer: 0, head: 0,
            ablate: [], patch_from: null },  // the latest run asked for
  shown: null,            // the inputs of the run on screen
  view: null,             // the key of the attention shown
  layer: 0, head: 0,      // the layer and head shown (the next run follows them)
  cache: new Map(),       // "run|view|layer" → heads × rows × cols
  logits: null,           // Float64Array: the run's output logits
  hover: null,            // {i, j}: the heatmap cell the neuron view explains
  pixels: null,           // vision: the image being drawn, s × s
  lensWanted: false,
  stageText: new Map(),   // "run|i" → a stage's values
};
let runSeq = 0, pending = 0, lastError = null, keyAsked = false;
const times = { firstPaint: null, slider: null, run: null, server: null };

// --- talking to the server ----------------------------------------------------------------
const KEY = 'attnlab-api-key';

/** One /api call, JSON in and out. A 401 asks for the key once (kept for the tab's life) and
 *  retries; any other failure throws the server's one-line error. */
async function api(path, body) {
  const headers = {}, key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = 'Bearer ' + key;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, { method: body === undefined ? 'GET' : 'POST', headers,
                                  body: body === undefined ? undefined : JSON.stringify(body) });
  if (res.status === 401 && !keyAsked) {
    keyAsked = true;
    const given = window.prompt('This server needs its API key (explain --serve --api-key):');
    if (given) { sessionStorage.setItem(KEY, given.trim()); return api(path, body); }
  }
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new Error((data && data.error) || `${path}: HTTP ${res.status}`);
  if (data === null) throw new Error(`${path}: the answer is not JSON`);
  return data;
}

/** body[data-state] is busy while any request is out, then ready, or error until a request
 *  succeeds again; #error shows the last failure. */
async function request(path, body) {
  const state = () => {
    document.body.dataset.state = pending > 0 ? 'busy' : lastError ? 'error' : 'ready';
  };
  pending++; state();
  try {
    const data = await api(path, body);
    lastError = null; $('error').hidden = true;
    return data;
  } catch (e) {
    lastError = e.message; $('error').textContent = e.message; $('error').hidden = false;
    throw e;
  } finally {
    pending--; state();
  }
}
const quietly = (p) => p.catch(() => null); // for callers with nothing to add: #error has it

// --- loading ------------------------------------------------------------------------------
const KINDS = {
  decoder: 'decoder: reads left to right and predicts the next token',
  encoder: 'encoder: every token sees the whole sentence',
  seq2seq: 'encoder–decoder: reads a source sentence, writes a target one token at a time',
  vision: 'Vision Transformer: the tokens are [CLS] and image patches; it predicts a class',
};

async function start() {
  const info = await quietly(request('/api/info'));
  if (!info) return;
  S.info = info;
  for (const k of ['model', 'device', 'precision']) $('info-' + k).textContent = info[k];
  $('info-kind').textContent = KINDS[info.kind] || info.kind;
  $('kind-explain').textContent = `At most ${info.max_tokens} tokens per input.`;
  const vision = info.kind === 'vision', seq2seq = info.kind === 'seq2seq';
  for (const [id, shown] of [['sentence-box', !vision], ['target-box', seq2seq],
    ['digit-box', vision], ['draw-box', vision], ['vision-section', vision],
    ['patching-section', !vision]]) $(id).hidden = !shown;
  if (info.masked_lm) {
    $('mask-hint').hidden = false;
    $('mask-hint').textContent = `This model fills in a hidden word: put ${info.mask_token} ` +
      'in the sentence, and it predicts the word at the first one.';
  }
  if (seq2seq) $('sentence-box').firstChild.textContent = 'Source sentence ';
  $('sentence').value = info.example || '';
  $('target').value = info.example_target || '';
  if (vision) {
    $('digit').max = info.image.digits - 1;
    $('digit').value = info.image.example;
    $('digit-range').textContent = `(0–${info.image.digits - 1})`;
  }
  $('output-title').textContent = vision ? 'The class' : seq2seq ? 'The next target token'
    : info.masked_lm ? `The word at ${info.mask_token}` : 'The next token';
  await quietly(run(readInputs('digit')));
}

// --- inputs and runs ----------------------------------------------------------------------
/** What the boxes change in the inputs. Vision: mode "digit" sends the test digit, "drawn" the
 *  painted image, none what the last run sent. A new sentence drops the patching partner,
 *  whose length may no longer match. */
function readInputs(mode) {
  const i = S.inputs, vision = S.info.kind === 'vision', c = {};
  c.sentence = vision ? '' : $('sentence').value;
  c.target = S.info.kind === 'seq2seq' ? $('target').value : null;
  if (c.sentence !== i.sentence || c.target !== i.target) c.patch_from = null;
  if (vision && mode === 'drawn') Object.assign(c, { image: copy(S.pixels), digit: null });
  if (vision && mode === 'digit') {
    Object.assign(c, { digit: parseInt($('digit').value, 10) || 0, image: null });
  }
  return c;
}

function runBody() {
  const { sentence, target, digit, image, layer, head, ablate, patch_from } = copy(S.inputs);
  return { sentence, target, digit, image, layer, head, ablate, patch_from };
}

/** POST /api/run with the inputs plus `changes`, at the layer and head shown. S.inputs runs
 *  ahead, so that a change made while a run is out builds on it; if the latest run fails, the
 *  inputs go back to those on screen. Only the latest run is drawn. */
async function run(changes = {}) {
  const seq = ++runSeq, t0 = performance.now();
  Object.assign(S.inputs, changes, { layer: S.layer, head: S.head });
  const body = runBody();
  let r;
  try {
    r = await request('/api/run', body);
  } catch (e) {
    if (seq === runSeq && S.shown) { S.inputs = copy(S.shown); drawAttention(); }
    throw e;
  }
  if (seq !== runSeq) return;
  S.shown = body;
  applyRun(r);
  times.run = performance.now() - t0; times.server = r.server_ms;
  showTimings();
}

function applyRun(r) {
  S.run = r;
  document.body.dataset.run = r.run;
  S.cache.clear(); S.stageText.clear();
  r.views.forEach((v) => S.cache.set(`${r.run}|${v.key}|${r.layer}`, v.weights));
  if (!r.views.some((v) => v.key === S.view)) S.view = r.views[0].key;
  $('view').replaceChildren(...r.views.map((v) => new Option(v.title, v.key)));
  $('view').value = S.view;
  $('run-title').textContent = r.title ? '· ' + r.title : '';
  S.logits = r.output && r.output.logits ? decodeLogits(r.output.logits) : null;
  for (const draw of [showTokens, showAttention, drawOutput, drawImage, drawAblation,
    drawPatching, drawStages]) draw();
  if (S.lensWanted) quietly(showLens()); else showLensNote('');
}

function showTokens() {
  const r = S.run;
  $('tokens').replaceChildren(...(S.info.kind === 'vision'
    ? [el('span', { class: 'chip' }, '[CLS]'), el('span', { class: 'muted' },
      ` + ${r.tokens.length - 1} patches` + (r.image ? ` (label: ${r.image.label})` : ''))]
    : r.tokens.map((t, i) => el('span', { class: 'chip', title: `position ${i}` }, t))));
  $('translation').hidden = !r.translation;
  $('translation').textContent = r.translation ? `Greedy translation: “${r.translation}”` : '';
}

// --- attention ----------------------------------------------------------------------------
const currentView = () => S.run.views.find((v) => v.key === S.view) || S.run.views[0];
const cacheKey = () => `${S.run.run}|${S.view}|${S.layer}`;

function fillSelect(sel, n, word, value) {
  sel.replaceChildren(...Array.from({ length: n }, (_, i) => new Option(`${word} ${i}`, i)));
  sel.value = value;
}

/** Draw the chosen view, layer and head; another layer's weights are fetched once per run. */
async function showAttention() {
  const v = currentView();
  S.layer = clamp(S.layer, 0, v.layers - 1);
  S.head = clamp(S.head, 0, v.heads - 1);
  fillSelect($('layer'), v.layers, 'layer', S.layer);
  fillSelect($('head'), v.heads, 'head', S.head);
  $('view-note').textContent = v.note || '';
  const key = cacheKey();
  if (!S.cache.has(key)) {
    $('hover').textContent = `Loading layer ${S.layer}…`;
    const a = await quietly(request(`/api/attention?run=${encodeURIComponent(S.run.run)}` +
      `&view=${encodeURIComponent(S.view)}&layer=${S.layer}`));
    if (!a) return;
    S.cache.set(key, a.weights);
    if (key !== cacheKey()) return; // the user moved on meanwhile
  }
  drawAttention();
}

function drawAttention() {
  const v = currentView(), all = S.cache.get(cacheKey());
  if (!all) return;
  const w = all[S.head];
  if (!S.hover || S.hover.i >= v.rows.length || S.hover.j >= v.cols.length) {
    const i = v.rows.length - 1; // at first: the last query, at its largest weight
    S.hover = { i, j: w[i].indexOf(Math.max(...w[i])) };
  }
  drawHeatmap(v, w);
  drawLines(v, w);
  drawHeads(v, all);
  drawNeuron();
  showHover();
  if (times.firstPaint === null) { times.firstPaint = performance.now(); showTimings(); }
}

/** The width a column of labels needs, roughly (measuring SVG text would be slow). */
const labelWidth = (labels, font) =>
  8 + 0.62 * font * Math.max(1, ...labels.map((t) => short(t).length));

/** Size an SVG and fill it from markup (one string: fast for 128 × 128 cells). Only
 *  presentation attributes are used, so a saved copy needs no stylesheet. */
function fillSVG(svg, width, height, parts) {
  [width, height] = [Math.ceil(width), Math.ceil(height)];
  svg.setAttribute('width', width); svg.setAttribute('height', height);
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('font-family', 'system-ui, sans-serif');
  svg.setAttribute('style', 'background: white');
  svg.innerHTML = parts.join(''); // one <rect> per weight, nothing else, in #heatmap
}

/** #heatmap: one square per weight; the value is written in when the squares are large. */
function drawHeatmap(v, w) {
  const R = v.rows.length, C = v.cols.length;
  const cell = clamp(Math.floor(440 / Math.max(R, C)), 6, 42), font = clamp(cell - 3, 8, 12);
  const left = labelWidth(v.rows, font), colW = labelWidth(v.cols, font);
  const top = colW * 0.82 + font + 2, out = [];
  const every = Math.ceil((font + 1) / cell); // small squares: a label every few, not a smear
  for (let i = 0; i < R; i++) {
    for (let j = 0; j < C; j++) {
      const x = left + j * cell, y = top + i * cell, p = w[i][j];
      out.push(`<rect data-i="${i}" data-j="${j}" x="${x}" y="${y}" width="${cell}" ` +
               `height="${cell}" fill="${shade(p)}"/>`);
      if (cell >= 30) out.push(`<text x="${x + cell / 2}" y="${y + cell / 2 + 3}" font-size="9" ` +
        `text-anchor="middle" fill="${ink(p)}" pointer-events="none">${p.toFixed(2)}</text>`);
    }
    const y = top + i * cell + cell / 2 + font / 3;
    if (i % every === 0) out.push(`<text x="${left - 4}" y="${y}" font-size="${font}" ` +
      `text-anchor="end">${esc(short(v.rows[i]))}</text>`);
  }
  v.cols.forEach((c, j) => j % every || out.push(`<text transform="translate(` +
    `${left + j * cell + cell / 2 + font / 3},${top - 4}) rotate(-55)" font-size="${font}">` +
    `${esc(short(c))}</text>`));
  out.push(`<path id="hm-focus" d="M0 0h${cell}v${cell}h-${cell}z" fill="none" stroke="#d33" ` +
           'stroke-width="2" visibility="hidden" pointer-events="none"/>');
  const svg = $('heatmap');
  fillSVG(svg, left + C * cell + colW * 0.6, top + R * cell + 8, out); // room for the slant
  Object.assign(svg.dataset, { cell, left, top });
}

/** Hovering a cell shows its value, outlines it, follows its query's lines and explains it
 *  in the neuron view. */
function onHeatmapHover(e) {
  if (e.target.dataset.i === undefined) return;
  S.hover = { i: +e.target.dataset.i, j: +e.target.dataset.j };
  showHover();
  focusLines('q', S.hover.i);
  drawNeuron();
}
function showHover() {
  const v = currentView(), w = S.cache.get(cacheKey()), { i, j } = S.hover, svg = $('heatmap');
  $('hover').textContent = `“${v.rows[i]}” (row ${i}) → “${v.cols[j]}” (column ${j}): ` +
    `weight ${fmt(w[S.head][i][j])}`;
  const f = $('hm-focus'), cell = +svg.dataset.cell;
  f.setAttribute('transform', `translate(${+svg.dataset.left + j * cell},` +
    `${+svg.dataset.top + i * cell})`);
  f.setAttribute('visibility', 'visible');
}

/** #lines: queries left, keys right, a line per weight (those under 0.005 would not show,
 *  and leaving them out keeps long inputs light). */
function drawLines(v, w) {
  const R = v.rows.length, C = v.cols.length, font = 12, gap = 170;
  const step = clamp(Math.floor(440 / Math.max(R, C)), 13, 24);
  const lw = labelWidth(v.rows.concat(v.cols), font), y = (n) => 8 + n * step + step / 2;
  const out = [];
  for (let i = 0; i < R; i++) {
    for (let j = 0; j < C; j++) {
      if (w[i][j] < 0.005) continue;
      out.push(`<line data-i="${i}" data-j="${j}" x1="${lw}" y1="${y(i)}" x2="${lw + gap}" ` +
        `y2="${y(j)}" stroke="rgb(30,90,200)" stroke-opacity="${w[i][j].toFixed(3)}" ` +
        `stroke-width="${(0.5 + 3.5 * w[i][j]).toFixed(2)}"/>`);
    }
  }
  const label = (side, t, n, x, anchor) => out.push(`<text data-side="${side}" data-i="${n}" ` +
    `x="${x}" y="${y(n) + 4}" font-size="${font}" text-anchor="${anchor}">${esc(short(t))}</text>`);
  v.rows.forEach((t, i) => label('q', t, i, lw - 6, 'end'));
  v.cols.forEach((t, j) => label('k', t, j, lw + gap + 6, 'start'));
  fillSVG($('lines'), 2 * lw + gap, Math.max(R, C) * step + 10, out);
  $('lines').classList.remove('focus');
  $('lines-hover').textContent = '\u00a0';
}

/** Highlight the lines of query i (side "q") or key i (side "k"), fade the rest, and name
 *  the strongest partners. */
function focusLines(side, i) {
  const svg = $('lines'), attr = side === 'q' ? 'i' : 'j';
  svg.classList.add('focus');
  svg.querySelectorAll('line').forEach((l) => l.classList.toggle('hl', +l.dataset[attr] === i));
  svg.querySelectorAll('text').forEach((t) => t.classList.toggle('hl',
    t.dataset.side === side && +t.dataset.i === i));
  const v = currentView(), w = S.cache.get(cacheKey())[S.head];
  const pairs = side === 'q' ? v.cols.map((c, j) => [c, w[i][j]])
    : v.rows.map((r, k) => [r, w[k][i]]);
  const top = pairs.sort((a, b) => b[1] - a[1]).slice(0, 4).map(([t, p]) => `${t} ${fmt(p, 2)}`);
  $('lines-hover').textContent = side === 'q'
    ? `“${v.rows[i]}” attends most to: ${top.join(', ')}`
    : `“${v.cols[i]}” is attended most by: ${top.join(', ')}`;
}

/** #heads: a small canvas per head of the layer (pixels, since heads × 128 × 128 SVG squares
 *  would be slow); a click picks the head, its button switches it off or on. The thumbnails
 *  stay the same elements from run to run; only their picture and classes change. */
function drawHeads(v, all) {
  const box = $('heads');
  if (box.children.length !== all.length) box.replaceChildren(...all.map((_, h) => newThumb(h)));
  all.forEach((w, h) => {
    const thumb = box.children[h], off = S.inputs.ablate.includes(headName(h));
    thumb.classList.toggle('selected', h === S.head);
    thumb.classList.toggle('ablated', off);
    thumb.querySelector('button.off').textContent = off ? 'switch on' : 'switch off';
    const R = w.length, C = w[0].length, canvas = thumb.querySelector('canvas');
    Object.assign(canvas, { width: C, height: R });
    const ctx = canvas.getContext('2d'), img = ctx.createImageData(C, R);
    w.forEach((row, i) => row.forEach((p, j) => img.data.set([...rgb(p), 255], 4 * (i * C + j))));
    ctx.putImageData(img, 0, 0);
    canvas.style.height = `${Math.round(84 * Math.min(2, R / C))}px`;
  });
}

function newThumb(h) {
  const thumb = el('div', { class: 'thumb', 'data-head': h, title: `head ${h}: click to see it` });
  const button = el('button', { class: 'off', type: 'button' });
  button.addEventListener('click', (e) => { e.stopPropagation(); toggleAblate(headName(h)); });
  thumb.append(el('canvas', { style: 'width:84px' }), el('div', {}, `head ${h}`), button);
  thumb.addEventListener('click', () => selectHead(h));
  return thumb;
}

/** What explain --ablate calls head h of the layer shown: view prefix + "L.H". */
const headName = (h) => `${currentView().ablate_prefix || ''}${S.layer}.${h}`;

/** Another head is drawn at once from the weights already here; the run then repeats in the
 *  background, since the neuron view and the stages belong to one layer and head. */
function selectHead(h) {
  S.head = h;
  $('head').value = h;
  drawAttention();
  quietly(run());
}

function toggleAblate(name) {
  const list = S.inputs.ablate.filter((n) => n !== name);
  if (list.length === S.inputs.ablate.length) list.push(name);
  S.inputs.ablate = list;
  drawAttention(); // the thumbnails show it before the run comes back
  quietly(run());
}

// --- the neuron view: one weight recomputed from q and k -----------------------------------
function drawNeuron() {
  const box = $('neuron'), r = S.run, n = r.neuron, first = r.views[0];
  const why = !n ? 'This run has no neuron view.'
    : S.view !== n.view ? `The neuron view is shown for the first attention (${first.title}); ` +
      'pick it above to see it.'
    : S.layer === r.layer && S.head === r.head ? null
    : `The neuron view is computed for layer ${r.layer}, head ${r.head} (the last run); ` +
      (S.head !== r.head ? 'the run for this head is on its way.'
        : 'press Run to compute it for this layer.');
  if (why) { box.textContent = why; return; }
  const { i, j } = S.hover, q = n.q[i], k = n.k[j], rows = first.rows, cols = first.cols;
  const dot = (kk) => kk.reduce((sum, x, c) => sum + q[c] * x, 0);
  // every key's score for query i, as the model forms it: q·k × scale + bias, then the mask
  const scores = n.k.map((kk, jj) => (n.mask[i][jj]
    ? dot(kk) * n.scale + (n.bias ? n.bias[i][jj] : 0) : -Infinity));
  const mine = softmax(scores), model = n.weights[i];
  const delta = Math.max(...model.map((w, jj) => Math.abs(mine[jj] - w)));
  const product = (x) => el('td',
    { style: `background:${diverge(x / 4)};color:${ink(Math.abs(x / 4))}` }, fmt(x));
  const comp = table(el('table', { class: 'num' }), `q_${i} ⊙ k_${j}, component by component`,
    ['c', `q (${short(rows[i], 10)})`, `k (${short(cols[j], 10)})`, 'q × k'], q,
    (qc, c) => ({ cells: [c, fmt(qc), fmt(k[c]), product(qc * k[c])] }));
  const soft = table(el('table', { class: 'num' }),
    `row ${i} (“${short(rows[i], 12)}”): the softmax over every key`,
    ['key', 'score', 'this page', 'the model'], cols, (c, jj) => ({
      cells: [short(c, 12), fmt(scores[jj]), fmt(mine[jj]), fmt(model[jj])],
      attrs: jj === j ? { class: 'focus' } : {} }));
  const d = dot(k), bias = n.bias ? n.bias[i][j] : null, steps = el('div', { class: 'steps' });
  [`sum: q_${i} · k_${j} = ${fmt(d)}`,
   `× scale ${fmt(n.scale)} (1/√${q.length}) = ${fmt(d * n.scale)}`,
   bias !== null ? `+ bias ${fmt(bias)} = ${fmt(d * n.scale + bias)}` : 'no bias',
   n.mask[i][j] ? 'not masked' : 'masked: this key may not be seen, so the score becomes −∞',
   `softmax over row ${i}: weight ${fmt(mine[j])} (the model: ${fmt(model[j])})`,
  ].forEach((t) => steps.appendChild(el('div', {}, t)));
  const ok = delta < 1e-4, scroll = el('div', { class: 'scroll tall' });
  const pair = el('div', { class: 'pair' });
  scroll.appendChild(comp);
  pair.append(scroll, soft);
  box.replaceChildren(el('p', {}, `Layer ${r.layer}, head ${r.head}: query “${rows[i]}” ` +
    `(row ${i}), key “${cols[j]}” (column ${j}).`), pair, steps, el('p',
    { class: ok ? 'ok' : 'failed' }, `Check: max |Δ| between this page's softmax and the ` +
    `model's weights = ${sci(delta)} ${ok ? '(they agree)' : '(they DIFFER)'}`));
}

// --- output: the probabilities, filtered in the page ---------------------------------------
/** The base64 little-endian float32 logits as float64 (decoded once per run). */
function decodeLogits(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataView(bytes.buffer);
  return Float64Array.from({ length: bytes.length / 4 }, (_, i) => data.getFloat32(4 * i, true));
}

/** softmax as torch computes it: exp(x − max), then × 1/sum; −∞ gives 0. */
function softmax(x) {
  let max = -Infinity, sum = 0;
  for (let i = 0; i < x.length; i++) if (x[i] > max) max = x[i];
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) { out[i] = Math.exp(x[i] - max); sum += out[i]; }
  const inv = 1 / sum;
  for (let i = 0; i < x.length; i++) out[i] *= inv;
  return out;
}

/** Indices by value, highest first, ties by the lower index (a stable sort). A source array's
 *  order is kept for the next call (dividing by T > 0 keeps it) and checked before reuse. */
const orders = new WeakMap();
function descending(x, source) {
  let order = orders.get(source);
  const still = order && order.length === x.length && order.every((a, t) => t === 0 ||
    x[a] === -Infinity || x[order[t - 1]] > x[a] || (x[order[t - 1]] === x[a] && order[t - 1] < a));
  if (!still) {
    order = Array.from({ length: x.length }, (_, i) => i);
    order.sort((a, b) => (x[a] > x[b] ? -1 : x[a] < x[b] ? 1 : a - b));
    if (source) orders.set(source, order);
  }
  return order;
}

/** attnlab.generation.decode.filter_logits on logits / T: top-k, then top-p, −∞ where a
 *  token is dropped. At T = 0 (greedy) nothing is filtered or divided. */
function filterLogits(logits, temperature, topK, topP) {
  const n = logits.length, x = Float64Array.from(logits);
  if (!(temperature > 0)) return x;
  for (let i = 0; i < n; i++) x[i] /= temperature;
  const order = descending(x, typeof logits === 'object' ? logits : null);
  if (topK !== null && topK !== undefined && topK < n) {
    const kth = x[order[topK - 1]]; // every tie of the k-th value stays
    for (let i = 0; i < n; i++) if (x[i] < kth) x[i] = -Infinity;
  }
  if (topP !== null && topP !== undefined && topP < 1) {
    // sorted probabilities (top-k's dropped tokens are all at the end, with p = 0)
    const p = softmax(Float64Array.from(order, (i) => x[i])), drop = [];
    let cum = 0;
    for (let t = 0; t < n; t++) {
      cum += p[t];
      if (cum - p[t] >= topP) drop.push(order[t]); // the mass before it already reaches p
    }
    drop.forEach((i) => { x[i] = -Infinity; });
  }
  return x;
}

/** window.attnlab.filter: softmax(filter_logits(logits / T, top_k, top_p)); at T = 0 the
 *  softmax of the logits themselves (the probabilities at T = 1). */
const filter = (logits, temperature, topK, topP) =>
  softmax(filterLogits(logits, temperature, topK, topP));

/** The sampling controls as numbers; an empty box is off, a bad one is off and named. */
function readControls() {
  const num = (id, parse) => ($(id).value.trim() === '' ? null : parse($(id).value));
  const k = num('top-k', (s) => parseInt(s, 10)), p = num('top-p', parseFloat);
  const seed = num('seed', (s) => parseInt(s, 10)), bad = [];
  const topK = k === null ? null : k >= 1 ? k
    : (bad.push('top-k must be a whole number ≥ 1'), null);
  const topP = p === null || p === 1 ? null : p > 0 && p < 1 ? p
    : (bad.push('top-p must be in (0, 1]'), null);
  return { temperature: parseFloat($('temperature').value), top_k: topK, top_p: topP,
           seed: Number.isNaN(seed) ? null : seed, bad };
}

/** #probs and #kept for the controls as they are, all in the page (timed as data-slider). */
function drawOutput() {
  if (!S.run) return;
  const t0 = performance.now(), out = S.run.output, c = readControls();
  $('temperature-value').textContent = c.temperature.toFixed(2);
  const note = !out || (out.note !== undefined && out.note !== null);
  $('output-note').hidden = !note;
  $('output-note').textContent = note && out ? out.note : '';
  $('sampling').hidden = $('kept-line').hidden = note;
  $('next').hidden = $('draw-info').hidden = note || S.info.kind === 'vision';
  if (note || !S.logits) {
    for (const id of ['probs', 'kept', 'filter-note']) $(id).replaceChildren();
    return;
  }
  const x = filterLogits(S.logits, c.temperature, c.top_k, c.top_p), p = softmax(x);
  $('kept').textContent = `${x.filter((v) => v > -Infinity).length} tokens kept`;
  $('filter-note').textContent = `At “${out.where}” the greedy pick is “${out.chosen}”. ` +
    (c.temperature > 0 ? `Probabilities at T = ${c.temperature.toFixed(2)}, after top-k and top-p.`
      : 'T = 0, greedy: the argmax; probabilities shown at T = 1 (top-k and top-p do not apply).') +
    (c.bad.length ? ' Ignored: ' + c.bad.join('; ') + '.' : '');
  // the top 10 of the kept set: the highest logits, as filtering keeps their order
  const order = descending(S.logits, S.logits), top = [];
  for (let t = 0; t < order.length && top.length < 10; t++) {
    if (x[order[t]] > -Infinity) top.push(order[t]);
  }
  const names = new Map(out.ids.map((id, n) => [id, out.texts[n]]));
  table($('probs'), null, ['#', out.kind === 'class' ? 'class' : 'token', 'probability', '',
    'logit'], top, (id, n) => {
    const token = names.has(id) ? names.get(id) : `#${id}`;
    return { cells: [n + 1, el('td', { class: 'tok' }, token), fmt(p[id]), bar(p[id]),
                     fmt(S.logits[id], 3)],
             attrs: { class: 'cand' + (n === 0 && token === out.chosen ? ' chosen' : ''),
                      'data-id': id, 'data-token': token, 'data-p': p[id],
                      'data-logit': S.logits[id] } };
  });
  times.slider = performance.now() - t0;
  showTimings();
}

/** #next: the server draws a token with these settings; the page reruns on the longer text. */
async function drawNext() {
  const c = readControls();
  $('next').disabled = true;
  try {
    // greedy decoding takes no top-k, top-p or seed (the server refuses them, as generate does)
    const greedy = c.temperature === 0;
    const d = await request('/api/next', { ...runBody(), temperature: c.temperature,
      top_k: greedy ? null : c.top_k, top_p: greedy ? null : c.top_p,
      seed: greedy ? null : c.seed });
    $('seed-used').textContent = d.seed;
    $('draw-result').textContent = `Drew “${d.token}” (id ${d.id}` +
      `${d.greedy ? ', greedy' : ''})` +
      `${d.done ? '; the model ended the text' : ''}.`;
    $('sentence').value = d.sentence;
    if (d.target !== null && d.target !== undefined) $('target').value = d.target;
    await run(readInputs());
  } catch (e) { /* #error has it */ } finally { $('next').disabled = false; }
}

// --- vision: the image, drawing, rollout ----------------------------------------------------
/** Grey cells (ink, 1, is dark), and optionally the rollout over them in red. */
function paint(canvas, px, overlay) {
  const size = px.length, cell = Math.floor(176 / size), ctx = canvas.getContext('2d');
  canvas.width = canvas.height = cell * size;
  px.forEach((row, i) => row.forEach((v, j) => {
    ctx.fillStyle = `rgb(${Array(3).fill(Math.round(255 * (1 - clamp(v, 0, 1))))})`;
    ctx.fillRect(j * cell, i * cell, cell, cell);
  }));
  if (!overlay) return;
  // scaled from the smallest share (clear) to the largest (deep red): the contrast shows even
  // when [CLS] looks almost everywhere alike; the caption gives the range
  const big = canvas.width / overlay.length, all = overlay.flat();
  const min = Math.min(...all), max = Math.max(...all);
  overlay.forEach((row, a) => row.forEach((v, b) => {
    ctx.fillStyle = `rgba(220,40,40,${(0.8 * (v - min) / (max - min || 1)).toFixed(3)})`;
    ctx.fillRect(b * big, a * big, big, big);
  }));
  $('rollout-caption').textContent = `rollout over the image: clear ${fmt(min, 3)}, ` +
    `deepest red ${fmt(max, 3)} (each patch's share of [CLS])`;
}

function drawImage() {
  const im = S.run.image;
  if (!im) return;
  S.pixels = copy(im.pixels);
  paint($('draw'), S.pixels);
  paint($('image-view'), im.pixels);
  paint($('rollout-view'), im.pixels, im.rollout);
}

/** Click or drag on #draw paints ink (Shift or the right button erases); letting go runs. */
function setupDrawing() {
  const canvas = $('draw');
  let value = null; // what the stroke paints: 1 ink, 0 erase; null between strokes
  const at = (e) => {
    const s = S.pixels ? S.pixels.length : 0, box = canvas.getBoundingClientRect();
    const i = Math.floor((e.clientY - box.top) / box.height * s);
    const j = Math.floor((e.clientX - box.left) / box.width * s);
    if (i < 0 || j < 0 || i >= s || j >= s) return;
    S.pixels[i][j] = value;
    paint(canvas, S.pixels);
  };
  canvas.addEventListener('contextmenu', (e) => e.preventDefault());
  canvas.addEventListener('pointerdown', (e) => {
    value = e.button === 2 || e.shiftKey ? 0 : 1;
    canvas.setPointerCapture(e.pointerId);
    at(e);
  });
  canvas.addEventListener('pointermove', (e) => { if (value !== null) at(e); });
  canvas.addEventListener('pointerup', () => {
    if (value === null) return;
    value = null;
    quietly(run(readInputs('drawn')));
  });
  $('clear-draw').addEventListener('click', () => {
    const s = S.info.image.size;
    S.pixels = Array.from({ length: s }, () => new Array(s).fill(0));
    quietly(run(readInputs('drawn')));
  });
}

// --- interventions: heads switched off, patching --------------------------------------------
const checkLine = (ch) => `Check: ${ch.name}: max |Δ| = ${sci(ch.error)}` +
  (ch.tol !== undefined ? ` (tolerance ${sci(ch.tol)})` : '') + (ch.ok ? ' ok.' : ' FAILED.');

function drawAblation() {
  const a = S.run.ablation, box = $('ablation');
  box.replaceChildren();
  $('ablation-check').textContent = '';
  if (!a) {
    $('ablation-line').textContent = 'No head is switched off: use “switch off” under a head ' +
      'thumbnail above.';
    return;
  }
  const change = a.p_after - a.p_before;
  $('ablation-line').textContent = `Switched off: ${a.heads.join(', ')}. The probability of ` +
    `“${a.chosen}” at “${a.where}” goes from ${fmt(a.p_before)} to ${fmt(a.p_after)} ` +
    `(${change >= 0 ? '+' : ''}${fmt(change)}).`;
  for (const [cls, title, rows] of [['before', 'before: every head on', a.before],
    ['after', 'after: those heads off', a.after]]) {
    box.appendChild(table(el('table', { class: 'num' }), title, ['#', 'token', 'p', ''], rows,
      ([token, p], n) => ({ cells: [n + 1, el('td', { class: 'tok' }, token), fmt(p), bar(p)],
        attrs: { class: cls + (token === a.chosen ? ' chosen' : ''), 'data-token': token,
                 'data-p': p } })));
  }
  $('ablation-check').textContent = [a.check ? checkLine(a.check) : '', a.note].join(' ');
  $('ablation-check').className = 'note ' + (a.check ? (a.check.ok ? 'ok' : 'failed') : '');
}

function drawPatching() {
  const p = S.run.patching;
  if (S.inputs.patch_from) $('patch-from').value = S.inputs.patch_from;
  if (!p) {
    $('patching').replaceChildren();
    $('patching-note').textContent = 'Type a second sentence with the same number of tokens, ' +
      'then press Patch.';
    return;
  }
  $('patching-note').textContent = `a = “${p.a}” (this run's top token), b = “${p.b}” ` +
    (p.same_top ? '(both runs predict a, so b is the other run\'s runner-up). '
      : '(the other run\'s top token). ') +
    `D = logit(b) − logit(a) at the last position: ${fmt(p.d_main)} here, ${fmt(p.d_other)} ` +
    'in the other run. Each cell: (D with that head patched − D here) / (D other − D here); ' +
    'blue moves toward the other run, red away; · no such head.';
  grid($('patching'), p.cols, p.rows, (i, j) => {
    const e = p.effect[i][j];
    return e === null ? { text: '·', value: null } : { text: (e >= 0 ? '+' : '') + fmt(e, 2),
      value: e, bg: diverge(e), dark: Math.abs(e) > 0.55 };
  });
}

// --- logit lens -----------------------------------------------------------------------------
function showLensNote(text, ok) {
  $('lens-note').textContent = text;
  $('lens-note').className = 'note' + (ok === undefined ? '' : ok ? ' ok' : ' failed');
  $('lens').replaceChildren();
}

/** Asked for once, the lens then follows every new run. */
async function showLens() {
  S.lensWanted = true;
  const id = S.run.run, d = await request(`/api/lens?run=${encodeURIComponent(id)}`);
  if (S.run.run !== id) return;
  if (d.note) { showLensNote(d.note); return; }
  showLensNote(`The model's own prediction at each position: ${d.final.join(' · ')}. ` +
    checkLine(d.check), d.check.ok);
  grid($('lens'), d.cols, d.layers, (i, j) => ({ text: `${d.tokens[i][j]} ${fmt(d.p[i][j], 2)}`,
    value: d.p[i][j], bg: shade(d.p[i][j]), dark: d.p[i][j] > 0.55 }));
}

// --- stages and checks ----------------------------------------------------------------------
/** A check belongs to a stage when its name begins with the stage's title as whole words
 *  ("layer 1" is not "layer 10"). */
const belongs = (check, title) => check.name.startsWith(title) &&
  !/[\p{L}\p{N}_]/u.test(check.name.charAt(title.length));

function drawStages() {
  const r = S.run, checks = r.checks || [], passed = checks.filter((c) => c.ok).length;
  $('stages-title').textContent = `· layer ${r.layer}, head ${r.head}`;
  $('checks-summary').textContent = `${passed} of ${checks.length} checks pass`;
  $('checks-summary').className = passed === checks.length ? 'ok' : 'failed';
  $('checks-box').open = passed < checks.length; // a failure is shown, not folded away
  $('checks').replaceChildren(...checks.map((c) => el('li', { class: c.ok ? 'ok' : 'failed' },
    `${c.ok ? '✓' : '✗'} ${c.name}` +
    (c.error === null ? '' : `: |Δ| = ${sci(c.error)} (tolerance ${sci(c.tol)})`))));
  $('stages').replaceChildren(...r.stages.map((s) => {
    const mine = checks.filter((c) => belongs(c, s.title));
    const status = !mine.length ? '' : mine.every((c) => c.ok) ? ' ok' : ' failed';
    const li = el('li', { class: 'stage' + status, 'data-i': s.i });
    const head = el('div', { class: 'stage-head', title: 'click for the values' });
    head.append(el('b', {}, s.title), el('code', {}, s.formula),
      el('span', { class: 'muted' }, s.shape ? `(${s.shape.join(' × ')})` : ''));
    head.addEventListener('click', () => quietly(toggleStage(li, s.i)));
    li.appendChild(head);
    if (s.note) li.appendChild(el('div', { class: 'note' }, s.note));
    return li;
  }));
}

/** A stage's values: fetched on the first click, folded away on the next. */
async function toggleStage(li, i) {
  const open = li.querySelector('pre'), key = `${S.run.run}|${i}`;
  if (open) { open.remove(); return; }
  if (!S.stageText.has(key)) {
    const d = await request(`/api/stage?run=${encodeURIComponent(S.run.run)}&i=${i}`);
    S.stageText.set(key, d.text);
  }
  if (!li.querySelector('pre')) li.appendChild(el('pre', {}, S.stageText.get(key)));
}

// --- saving -------------------------------------------------------------------------------
function download(blob, name) {
  const a = el('a', { href: URL.createObjectURL(blob), download: name });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

/** The heatmap as a standalone SVG document (its styling is all attributes). */
function heatmapSVG() {
  const svg = $('heatmap').cloneNode(true);
  svg.removeAttribute('id');
  for (const k of Object.keys(svg.dataset)) delete svg.dataset[k];
  svg.querySelector('#hm-focus')?.remove();
  return new XMLSerializer().serializeToString(svg);
}

function savePNG() {
  const svg = $('heatmap'), img = new Image(), scale = 2;
  const url = URL.createObjectURL(new Blob([heatmapSVG()], { type: 'image/svg+xml' }));
  img.onload = () => {
    const c = el('canvas', { width: svg.width.baseVal.value * scale,
                             height: svg.height.baseVal.value * scale });
    const ctx = c.getContext('2d');
    ctx.fillStyle = 'white';
    ctx.fillRect(0, 0, c.width, c.height);
    ctx.scale(scale, scale);
    ctx.drawImage(img, 0, 0);
    URL.revokeObjectURL(url);
    c.toBlob((b) => download(b, 'attnlab-heatmap.png'), 'image/png');
  };
  img.src = url;
}

async function saveHTML() {
  const d = await request('/api/html', runBody());
  download(new Blob([d.html], { type: 'text/html' }), 'attnlab-explain.html');
}

// --- timings --------------------------------------------------------------------------------
function showTimings() {
  const t = $('timings'), ms = (x) => (x === null ? '–' : `${Math.round(x)} ms`);
  for (const k of ['firstPaint', 'slider', 'run']) {
    if (times[k] !== null) t.dataset[k] = times[k].toFixed(1);
  }
  t.textContent = `first paint ${ms(times.firstPaint)} · last slider ${ms(times.slider)} · ` +
    `last run ${ms(times.run)}` + (times.server ? ` (server ${ms(times.server)})` : '');
}

// --- wiring ---------------------------------------------------------------------------------
function wire() {
  const on = (id, event, fn) => $(id).addEventListener(event, fn);
  const enter = (id, fn) => on(id, 'keydown', (e) => { if (e.key === 'Enter') fn(); });
  const runBoxes = (mode) => quietly(run(readInputs(mode)));
  on('run', 'click', () => runBoxes());
  enter('sentence', runBoxes);
  enter('target', runBoxes);
  on('digit', 'change', () => runBoxes('digit'));
  on('view', 'change', () => { S.view = $('view').value; S.hover = null; showAttention(); });
  on('layer', 'change', () => { S.layer = +$('layer').value; showAttention(); });
  on('head', 'change', () => selectHead(+$('head').value));
  on('heatmap', 'mouseover', onHeatmapHover);
  on('lines', 'mouseover', (e) => {
    if (e.target.dataset.side) focusLines(e.target.dataset.side, +e.target.dataset.i);
  });
  for (const id of ['temperature', 'top-k', 'top-p', 'seed']) on(id, 'input', drawOutput);
  on('next', 'click', drawNext);
  on('lens-button', 'click', () => quietly(showLens()));
  const patch = () => quietly(run({ ...readInputs(),
                                    patch_from: $('patch-from').value.trim() || null }));
  on('patch', 'click', patch);
  enter('patch-from', patch);
  on('save-svg', 'click', () =>
    download(new Blob([heatmapSVG()], { type: 'image/svg+xml' }), 'attnlab-heatmap.svg'));
  on('save-png', 'click', savePNG);
  on('save-html', 'click', () => quietly(saveHTML()));
  setupDrawing();
}

window.attnlab = { filter, state: S };
document.addEventListener('DOMContentLoaded', () => { wire(); start(); });
