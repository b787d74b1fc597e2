// rollflash dashboard: polls the JSON routes and draws SVG charts by hand (no libraries, no
// network beyond this server). What it drew is written into DOM attributes
// (data-curve-points, data-timeline-bars-*, data-trajectories) so a headless browser test
// can check it.
"use strict";

const KEY = new URLSearchParams(location.search).get("key");
const POLL_MS = Number(new URLSearchParams(location.search).get("poll_ms")) || 2000;
const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#4b5563"];

// Curves: title, metrics.jsonl fields. Fields a run does not write are left out.
const CURVES = [
  ["Reward (batch mean)", ["reward"]],
  ["Accuracy (batch; held-out greedy ● before, ■ after)", ["accuracy"]],
  ["Response length (tokens)", ["response_len_mean", "response_len_max"]],
  ["Entropy", ["entropy"]],
  ["KL", ["approx_kl", "kl_ref", "kl_reward"]],
  ["Behaviour–proximal mismatch", ["behav_kl", "behav_cap_frac"]],
  ["Importance ratio (mean per token, per sequence)", ["ratio_mean_token", "ratio_mean_seq"]],
  ["Clip fraction", ["clip_frac"]],
  ["Gradient norm", ["grad_norm"]],
  ["Loss", ["loss", "pg_loss"]],
  ["Learning rate", ["lr"]],
];
const ASYNC = [
  ["Staleness of trained samples (mean, max)", ["staleness", "staleness_max"]],
  ["Trained samples / s", ["samples_per_s"]],
  ["Trained tokens / s", ["tokens_per_s"]],
  ["Idle fraction of the step", ["rollout_idle", "trainer_idle"]],
  ["Weight sync (ms)", ["weight_sync_ms"]],
  ["Step time (s)", ["wall_s", "train_s", "wait_s"]],
  ["Sample accounting (cumulative)", ["started", "trained", "filtered", "dropped_stale", "aborted", "failed", "running", "buffered"]],
];
// Fields that are not curves (or are drawn elsewhere).
const SKIP = new Set(["step", "version", "samples", "tokens", "elapsed_s", "staleness_hist", "weight_sync_ms_by_backend"]);

const state = { metrics: null, timeline: [], trajectories: [], total: 0, live: null, liveHistory: [], updates: 0 };

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function api(path, params) {
  const q = new URLSearchParams(params || {});
  if (KEY) q.set("key", KEY);
  const r = await fetch(path + (q.toString() ? "?" + q : ""));
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function num(v) { return typeof v === "number" && isFinite(v); }

function fmt(v) {
  if (!num(v)) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
  return String(Math.round(v * 1000) / 1000);
}

// Ticks: about n round numbers over [lo, hi]; integers only when `integer`.
function ticks(lo, hi, n, integer) {
  const span = hi - lo || 1;
  let step = Math.pow(10, Math.floor(Math.log10(span / n)));
  for (const m of [1, 2, 5, 10]) { if (span / (step * m) <= n) { step *= m; break; } }
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  // Bounded: a span below the values' float resolution (a ratio of 1 ± 1e-16) would make
  // `t += step` a no-op and this loop endless.
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 && out.length < 50; t += step) {
    out.push(t);
    if (t + step === t) break;
  }
  return out;
}

// A line chart: series [{name, pts: [[x, y]], markers: bool}]. Returns [html, points].
function lineChart(title, series, xInteger) {
  const W = 330, H = 150, L = 42, R = 8, T = 6, B = 20;
  const all = series.flatMap(s => s.pts);
  if (all.length === 0) return ["", 0];
  let [x0, x1] = [Math.min(...all.map(p => p[0])), Math.max(...all.map(p => p[0]))];
  let [y0, y1] = [Math.min(...all.map(p => p[1])), Math.max(...all.map(p => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  // Equal, or equal up to rounding (1 and 1 + 2e-16): widen around the value.
  if (y1 - y0 <= 1e-9 * Math.max(Math.abs(y0), Math.abs(y1))) {
    y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1;
  }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`;
  for (const t of ticks(y0, y1, 4, false)) {
    svg += `<line x1="${L}" x2="${W - R}" y1="${sy(t)}" y2="${sy(t)}" stroke="#eee"/>`;
    svg += `<text x="${L - 3}" y="${sy(t) + 3}" font-size="9" text-anchor="end" fill="#666">${fmt(t)}</text>`;
  }
  for (const t of ticks(x0, x1, 6, xInteger)) {
    svg += `<text x="${sx(t)}" y="${H - 6}" font-size="9" text-anchor="middle" fill="#666">${fmt(t)}</text>`;
  }
  svg += `<line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#999"/>`;
  svg += `<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#999"/>`;
  let points = 0;
  series.forEach((s, i) => {
    const c = s.color || COLORS[i % COLORS.length];
    if (s.markers) {
      s.pts.forEach(p => {
        svg += s.square
          ? `<rect x="${sx(p[0]) - 4}" y="${sy(p[1]) - 4}" width="8" height="8" fill="${c}"><title>${esc(s.name)} ${fmt(p[1])}</title></rect>`
          : `<circle cx="${sx(p[0])}" cy="${sy(p[1])}" r="4" fill="${c}"><title>${esc(s.name)} ${fmt(p[1])}</title></circle>`;
      });
    } else if (s.pts.length === 1) {
      svg += `<circle cx="${sx(s.pts[0][0])}" cy="${sy(s.pts[0][1])}" r="2.5" fill="${c}"/>`;
    } else {
      const d = s.pts.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join("");
      svg += `<path d="${d}" fill="none" stroke="${c}" stroke-width="1.5"/>`;
    }
    points += s.pts.length;
  });
  svg += "</svg>";
  const legend = series.length > 1 || series.some(s => s.markers)
    ? `<div class="legend">${series.map((s, i) => `<span><i style="background:${s.color || COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`).join("")}</div>`
    : "";
  return [`<div class="chart" data-points="${points}"><h3>${esc(title)}</h3>${svg}${legend}</div>`, points];
}

// Stacked bars of the staleness histogram per step.
function staleChart(steps) {
  const rows = steps.filter(s => s.staleness_hist && typeof s.staleness_hist === "object");
  if (rows.length === 0) return "";
  const keys = [...new Set(rows.flatMap(r => Object.keys(r.staleness_hist)))].sort((a, b) => a - b);
  const W = 330, H = 150, L = 42, R = 8, T = 6, B = 20;
  const maxN = Math.max(1, ...rows.map(r => Object.values(r.staleness_hist).reduce((a, b) => a + b, 0)));
  const bw = (W - L - R) / rows.length;
  let svg = `<svg viewBox="0 0 ${W} ${H}">`;
  rows.forEach((r, i) => {
    let y = H - B;
    keys.forEach((k, j) => {
      const n = r.staleness_hist[k] || 0;
      const h = n / maxN * (H - T - B);
      if (n > 0) svg += `<rect x="${L + i * bw}" y="${y - h}" width="${Math.max(1, bw - 1)}" height="${h}" fill="${COLORS[j % COLORS.length]}"><title>step ${r.step}: ${n} samples ${k} versions old</title></rect>`;
      y -= h;
    });
  });
  for (const t of ticks(0, maxN, 4, true)) {
    const y = H - B - t / maxN * (H - T - B);
    svg += `<text x="${L - 3}" y="${y + 3}" font-size="9" text-anchor="end" fill="#666">${t}</text>`;
  }
  svg += `<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#999"/></svg>`;
  const legend = `<div class="legend">${keys.map((k, j) => `<span><i style="background:${COLORS[j % COLORS.length]}"></i>staleness ${k}</span>`).join("")}</div>`;
  return `<div class="chart"><h3>Staleness histogram per step (samples)</h3>${svg}${legend}</div>`;
}

function seriesOf(steps, fields, x) {
  return fields
    .map(f => ({ name: f, pts: steps.filter(s => num(s[f]) && num(s[x])).map(s => [s[x], s[f]]) }))
    .filter(s => s.pts.length > 0);
}

function evalMarkers(steps, x) {
  const summary = state.metrics && state.metrics.summary;
  const before = (summary && summary.eval_before) || (state.live && state.live.eval_before);
  const after = summary && summary.eval_after;
  const out = [];
  const first = steps.length ? steps[0][x] : 0;
  const last = steps.length ? steps[steps.length - 1][x] : 0;
  if (before && num(before.success_rate)) out.push({ name: "held-out before RL", pts: [[x === "step" ? 0 : first, before.success_rate]], markers: true, color: "#111" });
  if (after && num(after.success_rate)) out.push({ name: "held-out after RL", pts: [[last, after.success_rate]], markers: true, square: true, color: "#dc2626" });
  return out;
}

function drawCurves() {
  const steps = (state.metrics && state.metrics.steps) || [];
  const x = document.getElementById("xaxis").value;
  // Mean response length from tokens / samples when the run did not write it.
  steps.forEach(s => { if (!num(s.response_len_mean) && num(s.tokens) && s.samples > 0) s.response_len_mean = s.tokens / s.samples; });
  let html = "", points = 0, charts = 0;
  const used = new Set();
  for (const [title, fields] of CURVES) {
    fields.forEach(f => used.add(f));
    let series = seriesOf(steps, fields, x);
    if (fields[0] === "accuracy") series = series.concat(evalMarkers(steps, x));
    const [h, n] = lineChart(title, series, x === "step");
    html += h; points += n; charts += n > 0 ? 1 : 0;
  }
  // Whatever else the run writes (new learner metrics) gets a chart of its own.
  ASYNC.forEach(([, fs]) => fs.forEach(f => used.add(f)));
  const extra = [...new Set(steps.flatMap(s => Object.keys(s)))].filter(k => !used.has(k) && !SKIP.has(k) && steps.some(s => num(s[k])));
  for (const k of extra.sort()) {
    const [h, n] = lineChart(k, seriesOf(steps, [k], x), x === "step");
    html += h; points += n; charts += n > 0 ? 1 : 0;
  }
  const el = document.getElementById("curves");
  el.innerHTML = html || "<p>No steps yet.</p>";
  el.dataset.curvePoints = points;
  el.dataset.curves = charts;

  let asyncHtml = staleChart(steps);
  for (const [title, fields] of ASYNC) asyncHtml += lineChart(title, seriesOf(steps, fields, x), x === "step")[0];
  asyncHtml += liveChart();
  document.getElementById("async").innerHTML = asyncHtml;

  const a = steps.length ? steps[steps.length - 1] : null;
  document.getElementById("accounting").innerHTML = a && num(a.started)
    ? `samples: started ${a.started} = trained ${a.trained} + filtered ${a.filtered} + dropped-stale ${a.dropped_stale} + aborted ${a.aborted} + failed ${a.failed} + running ${a.running} + buffered ${a.buffered}`
    : "";
}

// Queue depth and running requests per backend, as the running process reports them.
function liveChart() {
  const h = state.liveHistory;
  if (h.length === 0) return "";
  const t0 = h[0].t;
  const series = [{ name: "queue depth", pts: h.map(p => [(p.t - t0) / 1000, p.queue]) }];
  const names = [...new Set(h.flatMap(p => Object.keys(p.running)))];
  for (const n of names) series.push({ name: `running on ${n}`, pts: h.filter(p => n in p.running).map(p => [(p.t - t0) / 1000, p.running[n]]) });
  return lineChart("Queue and running requests (live, s since the page opened)", series, false)[0];
}

const KIND_COLOR = { generate: "#2563eb", train: "#ea580c", sync: "#16a34a", pause: "#9ca3af" };

function drawTimeline() {
  const el = document.getElementById("timeline");
  const ev = state.timeline;
  const counts = { train: 0, generate: 0, sync: 0, pause: 0 };
  if (ev.length === 0) {
    el.innerHTML = "<p>No timeline events yet.</p>";
  } else {
    const end = Math.max(...ev.map(e => e.end_ms));
    const first = Math.min(...ev.map(e => e.start_ms));
    const win = Number(document.getElementById("window").value) * 1000;
    const start = win > 0 ? Math.max(first, end - win) : first;
    const shown = ev.filter(e => e.end_ms >= start);
    const lanes = [...new Set(shown.map(e => e.lane))].sort((a, b) => (a === "trainer" ? -1 : b === "trainer" ? 1 : a.localeCompare(b)));
    const W = 1000, L = 90, R = 10, LH = 26, T = 4, B = 22;
    const H = T + lanes.length * LH + B;
    const sx = t => L + (Math.max(t, start) - start) / Math.max(1, end - start) * (W - L - R);
    let svg = `<svg viewBox="0 0 ${W} ${H}">`;
    lanes.forEach((lane, i) => {
      svg += `<text x="${L - 6}" y="${T + i * LH + LH / 2 + 4}" font-size="11" text-anchor="end">${esc(lane)}</text>`;
      svg += `<line x1="${L}" x2="${W - R}" y1="${T + (i + 1) * LH}" y2="${T + (i + 1) * LH}" stroke="#eee"/>`;
    });
    // Pauses under, generation and training over them, syncs on top.
    const order = { pause: 0, generate: 1, train: 1, sync: 2 };
    shown.sort((a, b) => order[a.kind] - order[b.kind]);
    for (const e of shown) {
      const i = lanes.indexOf(e.lane);
      const x = sx(e.start_ms), w = Math.max(1, sx(e.end_ms) - x);
      const [y, h] = e.kind === "sync" ? [T + i * LH + 2, LH - 4] : e.kind === "pause" ? [T + i * LH + LH * 0.6, LH * 0.3] : [T + i * LH + 4, LH - 8];
      const what = e.kind === "generate" ? `${e.count} requests, ${e.tokens} tokens` : e.kind === "train" ? `${e.count} samples, ${e.tokens} tokens` : e.kind === "sync" ? (e.count ? "loaded" : "FAILED") : "paused";
      svg += `<rect class="bar-${e.kind}" x="${x.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${h}" fill="${KIND_COLOR[e.kind]}" opacity="${e.kind === "sync" ? 0.9 : 0.8}"><title>${esc(e.lane)} ${e.kind} v${e.version}: ${((e.end_ms - e.start_ms) / 1000).toFixed(2)} s, ${what}</title></rect>`;
      counts[e.kind] += 1;
    }
    for (const t of ticks(0, (end - start) / 1000, 10, false)) {
      svg += `<text x="${sx(start + t * 1000)}" y="${H - 6}" font-size="10" text-anchor="middle" fill="#666">${fmt(t)} s</text>`;
    }
    svg += "</svg>";
    const legend = `<div class="legend">${Object.entries(KIND_COLOR).map(([k, c]) => `<span><i style="background:${c}"></i>${k}</span>`).join("")} — seconds since ${new Date(start).toLocaleTimeString()}</div>`;
    el.innerHTML = svg + legend;
  }
  el.dataset.timelineBarsTrain = counts.train;
  el.dataset.timelineBarsRollout = counts.generate;
  el.dataset.timelineBarsSync = counts.sync;
  el.dataset.timelineBarsPause = counts.pause;
}

function drawTrajectories() {
  const el = document.getElementById("inspector");
  const list = state.trajectories;
  const versions = list.flatMap(t => t.pieces.filter(p => p.role === "model").map(p => p.version));
  const vmin = versions.length ? Math.min(...versions) : 0;
  const vmax = versions.length ? Math.max(...versions) : 0;
  const shade = v => {
    const f = vmax > vmin ? (v - vmin) / (vmax - vmin) : 1;
    return `hsl(210, 80%, ${Math.round(92 - f * 30)}%)`;
  };
  el.innerHTML = list.length === 0 ? "<p>No trajectories match.</p>" : list.map(t => {
    const text = t.pieces.map(p => {
      if (p.role === "prompt") return `<span class="prompt">${esc(p.text)}</span>`;
      if (p.role === "env") return `<span class="env">${esc(p.text)}</span>`;
      return `<span class="tok" style="background:${shade(p.version)}" title="v${p.version}">${esc(p.text)}</span>`;
    }).join("");
    // What the environment said in words (a verdict, a reward function's error): shown
    // under the text, an error in its own colour.
    const notes = (t.notes || []).map(([k, v]) =>
      `<div class="note${/error/.test(k) ? " error" : ""}" data-key="${esc(k)}"><b>${esc(k)}</b> ${esc(v)}</div>`).join("");
    return `<div class="traj" data-reward="${t.reward}"><div class="meta">step ${t.step} (trained from v${t.trained_version}) · reward <b>${fmt(t.reward)}</b> · ${esc(t.finish)} · ${t.turns} turn(s) · ${t.response_tokens} tokens · task seed ${t.seed}#${t.index} · started at v${t.start_version}</div><div class="text">${text}</div>${notes}</div>`;
  }).join("");
  el.dataset.trajectories = list.length;
  el.dataset.total = state.total;
}

async function refresh() {
  const err = document.getElementById("error");
  try {
    const params = {};
    const lo = document.getElementById("min_reward").value, hi = document.getElementById("max_reward").value;
    if (lo !== "") params.min_reward = lo;
    if (hi !== "") params.max_reward = hi;
    const [m, tl, tr, live] = await Promise.all([api("/api/metrics"), api("/api/timeline"), api("/api/trajectories", params), api("/api/live")]);
    state.metrics = m; state.timeline = tl.events; state.trajectories = tr.trajectories; state.total = tr.total; state.live = live;
    if (live.rollout) {
      const running = {};
      (live.rollout.backends || []).forEach(b => { running[b.name] = b.running; });
      state.liveHistory.push({ t: live.now_ms, queue: live.rollout.queue_depth, running });
      if (state.liveHistory.length > 600) state.liveHistory.shift();
    }
    const steps = m.steps.length;
    const phase = !live.running || live.phase === "done" ? "finished" : `running: ${live.phase || "starting"}`;
    document.getElementById("status").textContent = `${phase} · ${steps} step(s)`;
    err.textContent = "";
    draw();
    state.updates += 1;
    document.body.dataset.updates = state.updates;
    return live.running;
  } catch (e) {
    err.textContent = String(e.message || e);
    document.body.dataset.error = err.textContent;
    return true;
  }
}

function draw() {
  drawCurves();
  drawTimeline();
  drawTrajectories();
}

async function loop() {
  const running = await refresh();
  // A finished run's files do not change: one read is enough.
  if (running) setTimeout(loop, POLL_MS);
}

document.getElementById("xaxis").addEventListener("change", draw);
document.getElementById("window").addEventListener("change", draw);
document.getElementById("min_reward").addEventListener("change", refresh);
document.getElementById("max_reward").addEventListener("change", refresh);
loop();
