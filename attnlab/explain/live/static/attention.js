/* attnlab live explainer: the attention on screen: the heatmap, the lines, a thumbnail per head
 * (picking a head, switching it off), the neuron view; for vision the image, drawing on it and
 * the rollout.
 */
'use strict';

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
   // the scale is 1/√d_k unless the model sets its own (T5 scores unscaled: 1)
   `× scale ${fmt(n.scale)}` +
     `${Math.abs(n.scale * Math.sqrt(q.length) - 1) < 1e-6 ? ` (1/√${q.length})` : ' (the model\'s own)'}` +
     ` = ${fmt(d * n.scale)}`,
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
