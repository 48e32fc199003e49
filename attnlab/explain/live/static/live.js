/* attnlab live explainer: the browser side of `attnlab explain --serve`.
 *
 * The server runs the model; the page asks it for one run at a time (POST /api/run) and draws
 * what comes back: attention (heatmap, lines, every head), the neuron view, the output
 * probabilities, interventions, the logit lens and the checked stages. The DOM ids and data
 * attributes are the ones the browser tests read. What the sampling controls change is
 * recomputed here, with no server call (`filter`).
 *
 * This file holds the page's state, the server calls, loading, the run cycle, saving, timings
 * and the wiring of the controls. page.html loads it last, after helpers.js, attention.js and
 * output.js, whose functions and constants are globals shared by all four.
 */
'use strict';

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
