/* attnlab live explainer: what the model outputs: the logits decoded, softmax and filterLogits
 * (window.attnlab.filter), the probabilities table and the next token; heads switched off,
 * patching, the logit lens and the checked stages.
 */
'use strict';

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
