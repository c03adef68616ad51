// pepsi-httpd dashboard: one page, four views, from the JSON API.
// No framework, no CDN: plain DOM and SVG drawn here. Text glyphs are plain
// ASCII (some Chromium builds have no font for symbols such as the pause sign).
"use strict";

const ALLOW = document.body.dataset.allowActions === "true";
const REFRESH_MS = 2000;
const main = document.getElementById("main");
const statusEl = document.getElementById("status");
const bannerEl = document.getElementById("banner");
const STATUSES = ["pending", "running", "paused", "done", "failed", "timeout", "expired"];
const COLORS = ["#1f5fbf", "#2e7d32", "#b26a00", "#8e24aa", "#00838f", "#c62828", "#5d4037", "#546e7a"];
const HEALTH_TEXT = { serving: "serving", held_off: "held off", no_worker: "no worker can start",
                      paused: "paused", unknown: "no dispatcher reports it" };

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmtAge(s) {
  if (s == null) return "-";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
// The one timestamp format of the dashboard: "2026-11-29 21:05:30 UTC", from epoch
// seconds or a timestamp the API sends as text (ISO with its offset).
function fmtTime(v) {
  if (v == null || v === "") return "-";
  const d = typeof v === "number" ? new Date(v * 1000) : new Date(v);
  if (isNaN(d)) return String(v);
  return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}
function ts(v) {
  return v == null || v === "" ? "-" : `<time class="ts">${esc(fmtTime(v))}</time>`;
}
function fmtNum(v) {
  if (v === 0) return "0";
  if (v >= 100) return v.toFixed(0);
  if (v >= 1) return v.toFixed(1);
  return v.toPrecision(2);
}
async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}
async function act(url, payload, question) {
  if (!ALLOW) return null;
  if (!window.confirm(question)) return null;
  const r = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Pepsi-Action": "1" },
    body: JSON.stringify(payload),
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status);
  return body;
}
function setStatus(ok, text) {
  statusEl.textContent = text;
  statusEl.className = "status" + (ok ? "" : " down");
}
// What a row's status means here: paused rows say which kind, a cancelled one says so.
function kindOf(m) {
  const st = m.state || {};
  if (m.status === "paused") return "delayed_until" in st ? "delayed" : "retry wait";
  if (m.status === "failed" && "cancelled_status" in st) return "cancelled";
  return m.status;
}
function badge(kind) {
  return `<span class="badge ${esc(kind.replace(" ", "-"))}">${esc(kind)}</span>`;
}

// -- banner: no dispatcher, stages held off -------------------------------------------
function banner(d) {
  const lines = [];
  if (!d.dispatcher_live) {
    lines.push(`<p id="no-dispatcher" class="alert">No live dispatcher: nothing is being
      processed (start <code>pepsi-dispatch serve</code>).</p>`);
  }
  for (const [n, s] of Object.entries(d.stages)) {
    const h = s.health || {};
    if (h.state === "held_off" || h.state === "no_worker") {
      lines.push(`<p class="alert" data-held="${esc(n)}">Stage <b>${esc(n)}</b>:
        ${esc(HEALTH_TEXT[h.state])} (held off ${esc(fmtAge(h.held_seconds))}, ${h.pending} pending):
        ${esc(h.cause || "cause unknown")}</p>`);
    }
  }
  bannerEl.innerHTML = lines.join("");
}

// -- stage graph: layered left to right by distance from the entry stages ---------------
function layout(stages) {
  const names = Object.keys(stages);
  const incoming = Object.fromEntries(names.map((n) => [n, 0]));
  for (const n of names) for (const m of stages[n].next) if (m !== n && m in incoming) incoming[m]++;
  const depth = {};
  let queue = names.filter((n) => incoming[n] === 0);
  if (!queue.length && names.length) queue = [names[0]];
  queue.forEach((n) => (depth[n] = 0));
  while (queue.length) {
    const n = queue.shift();
    for (const m of stages[n].next) {
      if (m in stages && !(m in depth)) { depth[m] = depth[n] + 1; queue.push(m); }
    }
  }
  for (const n of names) if (!(n in depth)) depth[n] = 0;
  const rows = {};
  const pos = {};
  for (const n of names) {
    const d = depth[n];
    rows[d] = (rows[d] || 0) + 1;
    pos[n] = { x: 20 + d * 240, y: 30 + (rows[d] - 1) * 120 };
  }
  const h = 50 + Math.max(1, ...Object.values(rows)) * 120;
  const w = 40 + (Math.max(0, ...Object.values(depth)) + 1) * 240;
  return { pos, w, h };
}
function nodeState(s) {
  const h = s.health || {};
  if (h.state === "held_off" || h.state === "no_worker") return h.state;
  if (s.paused) return "paused";
  return h.state || "unknown";
}
function graphSVG(data) {
  const stages = data.stages;
  const { pos, w, h } = layout(stages);
  const NW = 200, NH = 96;
  let edges = "", nodes = "";
  for (const [n, s] of Object.entries(stages)) {
    for (const m of s.next) {
      if (!(m in pos)) continue;
      const a = pos[n], b = pos[m];
      let d;
      if (m === n) {
        d = `M${a.x + NW - 30},${a.y} C${a.x + NW - 30},${a.y - 30} ${a.x + NW + 20},${a.y - 10} ${a.x + NW},${a.y + 15}`;
      } else if (b.x > a.x) {
        d = `M${a.x + NW},${a.y + NH / 2} C${a.x + NW + 25},${a.y + NH / 2} ${b.x - 25},${b.y + NH / 2} ${b.x},${b.y + NH / 2}`;
      } else {
        d = `M${a.x + NW / 2},${a.y + NH} C${a.x + NW / 2},${a.y + NH + 40} ${b.x + NW / 2},${b.y + NH + 40} ${b.x + NW / 2},${b.y + NH}`;
      }
      edges += `<path class="edge" d="${d}" marker-end="url(#arrow)" data-edge="${esc(n)}>${esc(m)}"/>`;
    }
    const c = data.counts[n] || {};
    const p = pos[n];
    const state = nodeState(s);
    const hl = s.health || {};
    const held = state === "held_off" || state === "no_worker";
    const note = held ? HEALTH_TEXT[state] + ": " + (hl.cause || "") : state === "paused" ? "PAUSED" : "";
    const short = note.length > 30 ? note.slice(0, 29) + "..." : note;
    nodes += `<g class="node ${esc(state)}" data-node="${esc(n)}" data-health="${esc(state)}"
        transform="translate(${p.x},${p.y})">
      <title>${esc(n)}: ${esc(HEALTH_TEXT[state] || state)}${held ? " since " + esc(fmtTime(hl.since)) + " - " + esc(hl.cause || "") : ""}</title>
      <rect width="${NW}" height="${NH}"></rect>
      ${state === "paused" ? `<rect class="pause-bar" x="${NW - 22}" y="8" width="4" height="12"/><rect class="pause-bar" x="${NW - 14}" y="8" width="4" height="12"/>` : ""}
      ${held ? `<circle class="held-dot" cx="${NW - 14}" cy="14" r="6"/>` : ""}
      <text class="title" x="10" y="20">${esc(n)}</text>
      <text x="10" y="40">pending ${c.pending || 0} · running ${c.running || 0}</text>
      <text x="10" y="58">paused ${c.paused || 0} · failed ${c.failed || 0}</text>
      <text x="10" y="74" class="muted" font-size="11">oldest pending ${c.pending ? esc(fmtAge(data.oldest_pending[n])) : "-"}</text>
      <text x="10" y="90" class="state-note" font-size="11">${esc(short)}</text>
    </g>`;
  }
  return `<svg id="graph-svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="stage graph">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
    <path d="M0,0 L10,5 L0,10 z" fill="#8993a4"/></marker></defs>${edges}${nodes}</svg>`;
}

// -- charts from the ring of samples ---------------------------------------------------
let windowSeconds = 300;
function windowed(samples) {
  if (!samples.length) return [];
  const t1 = samples[samples.length - 1].t;
  return samples.filter((s) => s.t >= t1 - windowSeconds);
}
// Per stage, messages/s between consecutive samples.
function throughput(samples, stages) {
  const series = Object.fromEntries(stages.map((n) => [n, []]));
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    for (const n of stages) {
      const pa = ((a.stages || {})[n] || {}).processed || 0;
      const pb = ((b.stages || {})[n] || {}).processed || 0;
      series[n].push({ t: b.t, v: Math.max(0, pb - pa) / dt });
    }
  }
  return series;
}
// A quantile of a histogram's counts (non-cumulative, last bucket +Inf), linear in a bucket.
function quantile(bounds, counts, q) {
  const total = counts.reduce((x, y) => x + y, 0);
  if (!total) return null;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    if (seen + counts[i] >= q * total) {
      const lo = i ? bounds[i - 1] : 0;
      const hi = i < bounds.length ? bounds[i] : bounds[bounds.length - 1];
      const frac = counts[i] ? (q * total - seen) / counts[i] : 1;
      return lo + (hi - lo) * frac;
    }
    seen += counts[i];
  }
  return bounds[bounds.length - 1];
}
// Per stage, p50 and p95 of the service time over the 30 s before each sample.
function serviceTimes(samples, stages) {
  const series = Object.fromEntries(stages.map((n) => [n, { p50: [], p95: [] }]));
  let j = 0;
  for (let i = 1; i < samples.length; i++) {
    while (j < i - 1 && samples[i].t - samples[j + 1].t >= 30) j++;
    for (const n of stages) {
      const a = ((samples[j].stages || {})[n] || {}).service;
      const b = ((samples[i].stages || {})[n] || {}).service;
      if (!b) continue;
      const counts = b.counts.map((c, k) => c - (a && a.bounds.length === b.bounds.length ? a.counts[k] : 0));
      if (counts.some((c) => c < 0)) continue; // a dispatcher restarted: counts began again
      const p50 = quantile(b.bounds, counts, 0.5), p95 = quantile(b.bounds, counts, 0.95);
      if (p50 == null) continue;
      series[n].p50.push({ t: samples[i].t, v: p50 });
      series[n].p95.push({ t: samples[i].t, v: p95 });
    }
  }
  return series;
}
function lineChart(id, lines, yLabel, floor) {
  const W = 760, H = 190, L = 64, B = 34, T = 12, R = 12;
  const pts = lines.flatMap((l) => l.points);
  if (pts.length < 2) return `<p class="muted" id="${id}-empty">collecting samples (one every few seconds)...</p>`;
  const t0 = Math.min(...pts.map((p) => p.t)), t1 = Math.max(...pts.map((p) => p.t));
  const max = Math.max(floor, ...pts.map((p) => p.v)) * 1.1;
  const X = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
  const Y = (v) => H - B - (v / max) * (H - B - T);
  let grid = "";
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4;
    grid += `<line class="grid" x1="${L}" y1="${Y(v)}" x2="${W - R}" y2="${Y(v)}"/>
      <text class="tick" x="${L - 6}" y="${Y(v) + 4}" text-anchor="end">${fmtNum(v)}</text>`;
  }
  const shown = new Set();
  for (let k = 0; k <= 4; k++) {
    const t = t0 + ((t1 - t0) * k) / 4;
    const label = fmtTime(t).slice(11, 19);
    if (shown.has(label) || (k > 0 && k < 4 && t1 - t0 < 8)) continue; // no overlapping labels
    shown.add(label);
    const anchor = k === 0 ? "start" : k === 4 ? "end" : "middle";
    grid += `<text class="tick" x="${X(t)}" y="${H - B + 16}" text-anchor="${anchor}">${label}</text>`;
  }
  const paths = lines.map((l) => l.points.length ? `<path class="series${l.dashed ? " dashed" : ""}"
      stroke="${l.color}" d="${l.points.map((p, i) => (i ? "L" : "M") + X(p.t).toFixed(1) + "," + Y(p.v).toFixed(1)).join(" ")}"/>` : "").join("");
  return `<svg id="${id}" class="chart" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">
    ${grid}<line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>
    <line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/>
    <text class="axis-label" transform="translate(14,${(H - B) / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text>
    <text class="axis-label" x="${(W + L) / 2}" y="${H - 3}" text-anchor="middle">time (UTC)</text>
    ${paths}</svg>`;
}
function legend(names) {
  return `<div class="legend">${names.map((n, i) =>
    `<span><i class="swatch" style="background:${COLORS[i % COLORS.length]}"></i>${esc(n)}</span>`).join("")}</div>`;
}
function charts(d) {
  const samples = windowed(d.samples);
  const names = Object.keys(d.stages).filter((n) => d.stages[n].registered);
  const tp = throughput(samples, names);
  const sv = serviceTimes(samples, names);
  const color = (n) => COLORS[names.indexOf(n) % COLORS.length];
  const tpLines = names.map((n) => ({ color: color(n), points: tp[n] }));
  const svLines = names.flatMap((n) => [
    { color: color(n), points: sv[n].p95 },
    { color: color(n), points: sv[n].p50, dashed: true },
  ]);
  const sel = [[300, "5 min"], [900, "15 min"], [3600, "1 h"]].map(([s, label]) =>
    `<button class="win${s === windowSeconds ? " active" : ""}" data-window="${s}">${label}</button>`).join(" ");
  return `<section id="throughput"><h2>Throughput per stage <span class="muted">(messages/s, from the
      stage statistics; the scale follows the window shown, so an older spike does not flatten it)</span></h2>
      <p>window ${sel}</p>${legend(names)}${lineChart("chart-svg", tpLines, "messages / s", 1)}</section>
    <section id="service"><h2>Service time per stage <span class="muted">(seconds from hand-out to answer,
      p95 solid, p50 dashed, over the 30 s before each point; from the dispatchers' histograms)</span></h2>
      ${legend(names)}${lineChart("service-svg", svLines, "seconds", 0.01)}</section>`;
}

// -- views ---------------------------------------------------------------------------
async function overview(d) {
  d.schedules = (await getJSON("/api/schedules")).rows;
  const stats = Object.fromEntries(d.stage_stats.map((s) => [s.stage, s]));
  const names = Object.keys(d.stages);
  let failedRows = 0, failuresCounted = 0;
  const rows = names.map((n) => {
    const c = d.counts[n] || {};
    const s = stats[n] || {};
    const st = d.stages[n];
    const state = nodeState(st);
    failedRows += c.failed || 0;
    failuresCounted += (s.failed ?? 0) + (s.timeouts ?? 0) + (s.crashes ?? 0);
    const btn = st.registered ? `<button id="pause-${esc(n)}" data-stage="${esc(n)}" data-paused="${st.paused ? "1" : "0"}"
        class="pause" ${ALLOW ? "" : "disabled hidden"}>${st.paused ? "Resume" : "Pause"}</button>` : "";
    const h = st.health || {};
    const held = state === "held_off" || state === "no_worker";
    // Try now: resume the stage (pause_stage), which ends its hold-off at once.
    const tryNow = held && st.registered && ALLOW ? ` <button id="trynow-${esc(n)}" data-stage="${esc(n)}"
        class="trynow" title="end the hold-off: start a worker now (after fixing its program)">Try now</button>` : "";
    return `<tr data-stage="${esc(n)}"><td><a href="/messages?stage=${encodeURIComponent(n)}">${esc(n)}</a>
      ${st.registered ? "" : ' <span class="muted">(not registered)</span>'}</td>
      <td data-health="${esc(state)}">${badge(HEALTH_TEXT[state] || state)}${held ?
        `<div class="cause" title="${esc(h.cause)}">${esc(h.cause)} <span class="muted">since ${ts(h.since)}</span></div>` : ""}</td>
      ${["pending", "running", "paused", "failed", "done"].map((k) =>
        `<td class="num" data-count="${k}"><a href="/messages?stage=${encodeURIComponent(n)}&status=${k}">${c[k] || 0}</a></td>`).join("")}
      <td class="num" data-oldest>${c.pending ? esc(fmtAge(d.oldest_pending[n])) : "-"}</td>
      <td class="num" data-due>${d.retries_due[n] || 0}</td>
      <td class="num" data-processed>${s.processed ?? 0}</td>
      <td class="num" data-failures>${(s.failed ?? 0) + (s.timeouts ?? 0) + (s.crashes ?? 0)}</td>
      <td>${btn}${tryNow}</td></tr>`;
  }).join("");
  const disp = d.dispatchers.map((x) => `<tr data-dispatcher="${x.dispatcher_id}">
      <td>${x.dispatcher_id}</td><td>${esc(x.hostname)}</td><td>${x.pid}</td>
      <td>${x.live ? badge("live") : badge("stale")}</td>
      <td class="num">${esc(fmtAge(x.heartbeat_age))}</td>
      <td>${esc(Object.entries(x.workers || {}).map(([s, w]) =>
        `${s}: ${w.busy} busy, ${w.idle} idle`).join("; ") || "-")}</td></tr>`).join("");
  const t = d.totals;
  main.innerHTML = `
    <section id="graph"><h2>Stage graph <span class="muted">(the stage registry the dispatcher wrote)</span></h2>
      ${names.length ? graphSVG(d) :
      '<p class="muted">no stages registered yet (a dispatcher registers them when it starts)</p>'}</section>
    <section><h2>Stages</h2><table id="stages"><thead><tr><th>stage</th><th>health</th><th class="num">pending</th>
      <th class="num">running</th><th class="num">paused</th><th class="num">failed</th><th class="num">done</th>
      <th class="num">oldest pending</th><th class="num">retries due</th><th class="num">processed</th>
      <th class="num" title="failures the dispatcher counted, requeued ones included">failures counted</th><th></th></tr></thead><tbody>${rows}</tbody></table>
      <p class="muted" id="failed-explained"><b id="failed-rows">${failedRows}</b> failed rows now
      (messages in failed, timeout or expired, the "failed" column) ·
      <b id="failures-counted">${failuresCounted}</b> failures counted since the statistics began
      (every failed attempt, also of messages requeued or retried since; the "failures counted" column)</p></section>
    ${charts(d)}
    <section><h2>Totals</h2><p class="muted"><b id="total-messages">${t.messages ?? 0}</b> handed out,
      <b id="total-runs">${t.stage_runs ?? 0}</b> stage runs, <b id="total-failed">${t.failed ?? 0}</b> failures counted,
      <b id="total-requeued">${t.requeued ?? 0}</b> requeued</p></section>
    <section><h2>Failures by reason</h2>${reasonsTable(d.failure_reasons.slice(0, 5))}
      <p><a href="/failures">all failure groups</a></p></section>
    <section><h2>Schedules</h2><table id="schedules"><thead><tr><th>schedule</th><th>stage</th>
      <th>ticks</th><th>last tick</th><th>next tick</th></tr></thead><tbody>${(d.schedules || []).map((s) =>
      `<tr><td>${esc(s.name)}</td><td>${esc(s.stage ?? "-")}</td><td>${esc(s.spec ?? "-")}</td>
        <td>${ts(s.last_tick)}</td><td>${s.next_tick == null ? "- (in no configuration)" : ts(s.next_tick)}</td></tr>`).join("") ||
      '<tr><td colspan="5" class="muted">none ([schedule-NAME] sections of pepsi.conf)</td></tr>'}</tbody></table></section>
    <section><h2>Dispatchers</h2><table id="dispatchers"><thead><tr><th>id</th><th>host</th><th>pid</th>
      <th>state</th><th class="num">heartbeat</th><th>workers</th></tr></thead><tbody>${disp ||
      '<tr><td colspan="6" class="muted">none registered</td></tr>'}</tbody></table></section>`;
  for (const b of main.querySelectorAll("button.pause")) {
    b.onclick = () => guarded(async () => {
      const pause = b.dataset.paused !== "1";
      const r = await act("/api/pause", { stage: b.dataset.stage, paused: pause },
        `${pause ? "Pause" : "Resume"} stage ${b.dataset.stage}?` +
        (pause ? " Running messages finish; nothing new is claimed." : " Its hold-off, if any, ends too."));
      if (r) await refresh();
    });
  }
  for (const b of main.querySelectorAll("button.trynow")) {
    b.onclick = () => guarded(async () => {
      const r = await act("/api/pause", { stage: b.dataset.stage, paused: false },
        `Try stage ${b.dataset.stage} now? Its hold-off ends and a worker is started at once` +
        " (fix its program first).");
      if (r) await refresh();
    });
  }
  groupButtons();
  for (const b of main.querySelectorAll("button.win")) {
    b.onclick = () => { windowSeconds = Number(b.dataset.window); refresh(); };
  }
}
function groupHref(r) {
  return `/failures?stage=${encodeURIComponent(r.stage)}&group=${encodeURIComponent(r.reason)}`;
}
function reasonsTable(reasons) {
  if (!reasons.length) return '<p class="muted" id="no-failures">no failed messages</p>';
  return `<table class="reasons"><thead><tr><th>stage</th><th>reason (numbers, ids and hex masked)</th>
    <th class="num">messages</th><th class="num">newest</th><th></th></tr></thead><tbody>${reasons.map((r) => `<tr class="reason"
      data-stage="${esc(r.stage)}" data-reason="${esc(r.reason)}"><td>${esc(r.stage)}</td>
      <td><a class="reason-link" href="${groupHref(r)}">${esc(r.reason)}</a>
      ${(r.raw || []).length > 1 || (r.raw || [{}])[0].reason !== r.reason ? `<details class="raw"><summary>${(r.raw || []).length}${(r.raw || []).length >= 5 ? "+" : ""} raw reason(s)</summary>
        <ul>${(r.raw || []).map((x) => `<li><code>${esc(x.reason)}</code> <span class="muted">x${x.count}</span></li>`).join("")}</ul></details>` : ""}</td>
      <td class="num" data-count>${r.count}</td>
      <td class="num"><a href="/message/${r.newest_id}">#${r.newest_id}</a></td>
      <td>${ALLOW ? `<button class="requeue-group" data-stage="${esc(r.stage)}" data-group="${esc(r.reason)}"
        data-count="${r.count}">Requeue group</button>` : ""}</td></tr>`).join("")}</tbody></table>
    <p id="group-result" class="result"></p>`;
}
// An action on every message a filter selects (pepsi.requeue_matching / cancel_matching):
// count it, confirm with the count, act on what was counted (ids up to the newest counted).
async function bulk(action, filters, question) {
  const q = new URLSearchParams({ action });
  for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
  const c = await getJSON("/api/bulk?" + q.toString());
  if (!c.matched) return { matched: 0, rows: 0 };
  const r = await act("/api/bulk", { action, ...filters, before: c.newest_id + 1 }, question(c.matched));
  return r && { matched: c.matched, rows: r.rows };
}
// "Requeue group": every message of the group, counted and confirmed.
function groupButtons() {
  for (const b of main.querySelectorAll("button.requeue-group")) {
    b.onclick = () => guarded(async () => {
      const r = await bulk("requeue", { stage: b.dataset.stage, group: b.dataset.group },
        (n) => `Requeue the ${n} message(s) of group "${b.dataset.group}" (stage ${b.dataset.stage})?`);
      if (r && r.matched) {
        await refresh();
        const out = document.getElementById("group-result");
        if (out) out.textContent = `${r.rows} of ${r.matched} message(s) of "${b.dataset.group}" requeued`;
      }
    });
  }
}
async function failures(d) {
  const q = new URLSearchParams(location.search);
  if (!q.has("group") && !q.has("reason")) {
    main.innerHTML = `<section><h2>Failures by reason</h2>
      <p class="muted">Failed, timed-out and expired messages grouped by stage and reason, numbers, ids and
      hex masked. Open a group for its messages and actions; "raw reasons" shows the reasons as written.</p>
      ${reasonsTable(d.failure_reasons)}</section>`;
    groupButtons();
    return;
  }
  const group = q.get("group") || q.get("reason");
  const params = new URLSearchParams({ group, limit: "1000" });
  if (q.get("stage")) params.set("stage", q.get("stage"));
  const list = await getJSON("/api/messages?" + params.toString());
  const ids = list.rows.map((r) => r.workqueue_id);
  main.innerHTML = `<section><h2>Failed messages${q.get("stage") ? " of stage " + esc(q.get("stage")) : ""}:
    <code>${esc(group)}</code></h2>
    <p><a href="/failures">&larr; all groups</a>
    ${ALLOW && ids.length ? ` <button id="requeue-all">Requeue the whole group</button>` : ""}
    <span id="msg-result" class="result"></span></p>
    ${ids.length >= 1000 ? '<p class="muted">showing the newest 1000 of the group; the action takes all of it.</p>' : ""}
    <table id="failed"><thead><tr><th>id</th><th>stage</th><th>status</th><th class="num">retries</th>
    <th>reason as written</th><th>updated</th></tr></thead><tbody>${list.rows.map((r) => `<tr data-id="${r.workqueue_id}">
    <td><a href="/message/${r.workqueue_id}">#${r.workqueue_id}</a></td><td>${esc(r.stage)}</td>
    <td>${badge(r.kind)}</td><td class="num">${r.retries}</td>
    <td>${esc(r.reason)}</td><td>${ts(r.updated_at)}</td></tr>`).join("") ||
    '<tr><td colspan="6" class="muted">none</td></tr>'}</tbody></table></section>`;
  const all = document.getElementById("requeue-all");
  if (all) all.onclick = () => guarded(async () => {
    const r = await bulk("requeue", { stage: q.get("stage") || "", group },
      (n) => `Requeue ${n} failed message(s) of this group?`);
    if (r) { flash(`${r.rows} of ${r.matched} message(s) requeued`); await refresh(); }
  });
}

// -- the message list ------------------------------------------------------------------
const FILTERS = ["status", "stage", "older_than", "where", "group", "limit"];
// The filters of a bulk action: the list's, without the page (limit, before).
const BULK_FILTERS = ["status", "stage", "older_than", "where", "group"];
// The statuses each bulk action acts on (pepsi.requeue_matching, pepsi.cancel_matching).
const ACTS_ON = { requeue: ["failed", "timeout", "expired"], cancel: ["pending", "paused"] };
async function messages() {
  const q = new URLSearchParams(location.search);
  const params = new URLSearchParams();
  for (const k of [...FILTERS, "before"]) if (q.get(k)) params.set(k, q.get(k));
  let d, error = "";
  try { d = await getJSON("/api/messages?" + params.toString()); } catch (e) { d = { rows: [] }; error = e.message; }
  const opt = (v, label) => `<option value="${v}" ${q.get("status") === v ? "selected" : ""}>${label}</option>`;
  const rows = d.rows.map((r) => `<tr data-id="${r.workqueue_id}">
    <td><input type="checkbox" class="pick" value="${r.workqueue_id}"></td>
    <td><a href="/message/${r.workqueue_id}">#${r.workqueue_id}</a></td><td>${esc(r.stage)}</td>
    <td data-kind="${esc(r.kind)}">${badge(r.kind)}</td><td class="num">${r.retries}</td>
    <td>${r.due != null ? "due " + ts(r.due) : ""}</td>
    <td class="reason-cell">${esc(r.reason ?? "")}</td><td><code>${esc(r.payload_preview)}</code></td>
    <td>${ts(r.updated_at)}</td></tr>`).join("");
  const last = d.rows.length ? d.rows[d.rows.length - 1].workqueue_id : null;
  const next = new URLSearchParams(params);
  if (last != null) next.set("before", last);
  main.innerHTML = `<section><h2>Messages</h2>
    <form id="filters" class="filters">
      <label>status <select name="status">${opt("", "any")}${STATUSES.map((s) => opt(s, s)).join("")}</select></label>
      <label>stage <input name="stage" size="10" value="${esc(q.get("stage") || "")}"></label>
      <label>older than <input name="older_than" size="6" placeholder="10m" value="${esc(q.get("older_than") || "")}"></label>
      <label>payload contains <input name="where" size="22" placeholder='{"customer": 7}' value="${esc(q.get("where") || "")}"></label>
      <label>reason group <input name="group" size="16" placeholder="bad input n=&lt;n&gt;" value="${esc(q.get("group") || "")}"></label>
      <label>limit <input name="limit" size="4" value="${esc(q.get("limit") || "100")}"></label>
      <button type="submit" id="apply">Show</button>
    </form>
    ${error ? `<p class="error" id="list-error">${esc(error)}</p>` : ""}
    <p>${ALLOW ? `<button id="sel-requeue" disabled>Requeue selected</button>
      <button id="sel-cancel" class="danger" disabled>Cancel selected</button>
      <span class="bulk">all matching the filter, every page:
      ${bulkButton("requeue", "Requeue all matching", q)} ${bulkButton("cancel", "Cancel all matching", q)}</span>` :
      '<span class="muted">read-only (start pepsi-httpd with --allow-actions for actions)</span>'}
      <span id="msg-result" class="result"></span></p>
    <table id="list"><thead><tr><th><input type="checkbox" id="pick-all" title="select all shown"></th>
      <th>id</th><th>stage</th><th>status</th><th class="num">retries</th><th>due</th><th>reason</th>
      <th>payload</th><th>updated</th></tr></thead>
    <tbody>${rows || '<tr><td colspan="9" class="muted" id="list-empty">no messages match</td></tr>'}</tbody></table>
    <p>${q.get("before") ? `<a href="/messages?${new URLSearchParams([...params].filter(([k]) => k !== "before"))}">&larr; newest</a> ` : ""}
      ${last != null && d.rows.length >= Number(params.get("limit") || 100) ? `<a id="older" href="/messages?${next}">older &rarr;</a>` : ""}</p></section>`;
  document.getElementById("filters").onsubmit = (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const p = new URLSearchParams();
    for (const k of FILTERS) if (String(f.get(k) || "").trim()) p.set(k, String(f.get(k)).trim());
    history.pushState(null, "", "/messages?" + p.toString());
    refresh();
  };
  const picks = () => [...main.querySelectorAll("input.pick:checked")].map((e) => Number(e.value));
  const sync = () => {
    for (const id of ["sel-requeue", "sel-cancel"]) {
      const b = document.getElementById(id);
      if (b) b.disabled = picks().length === 0;
    }
  };
  for (const c of main.querySelectorAll("input.pick")) c.onchange = sync;
  document.getElementById("pick-all").onchange = (ev) => {
    for (const c of main.querySelectorAll("input.pick")) c.checked = ev.target.checked;
    sync();
  };
  const selAct = (id, url, verb, note) => {
    const b = document.getElementById(id);
    if (b) b.onclick = () => guarded(async () => {
      const ids = picks();
      const r = await act(url, { ids }, `${verb} ${ids.length} selected message(s)? ${note}`);
      if (r) { flash(`${verb}: ${r.rows} of ${ids.length} selected message(s) ${verb === "Requeue" ? "requeued" : "cancelled"}` +
        (r.rows < ids.length ? ` (the others are not in a status that allows it)` : "")); await refresh(); }
    });
  };
  selAct("sel-requeue", "/api/requeue", "Requeue", "Failed, timed-out and expired ones go back to pending.");
  selAct("sel-cancel", "/api/cancel", "Cancel", "Pending and paused ones become failed (cancelled by operator).");
  for (const b of main.querySelectorAll("button.bulk-action")) b.onclick = () => bulkOnFilter(b.dataset.action, q);
}
// A bulk button of the message list: disabled when the status filter is one the action never takes.
function bulkButton(action, label, q) {
  const status = q.get("status");
  const off = (status && !ACTS_ON[action].includes(status)) || (action === "cancel" && q.get("group"));
  return `<button id="bulk-${action}" class="bulk-action${action === "cancel" ? " danger" : ""}" data-action="${action}"
    ${off ? `disabled title="${action} acts on ${ACTS_ON[action].join(", ")} messages only${action === "cancel" ? " (no reason group)" : ""}"` : ""}>${label}</button>`;
}
async function bulkOnFilter(action, q) {
  return guarded(async () => {
    const filters = Object.fromEntries(BULK_FILTERS.map((k) => [k, q.get(k) || ""]));
    const shown = BULK_FILTERS.filter((k) => filters[k]).map((k) => `${k.replace("_", " ")} ${filters[k]}`).join(", ");
    const what = shown ? `matching this filter (${shown})` : "(no filter: all of them)";
    const statuses = ACTS_ON[action].join(", ");
    const r = await bulk(action, filters, (n) => `${action === "requeue" ? "Requeue" : "Cancel"} all ${n} ${statuses}` +
      ` message(s) ${what}? ` + (action === "requeue" ? "They go back to pending." : "They become failed (cancelled by operator)."));
    if (!r) return;
    const past = action === "requeue" ? "requeued" : "cancelled";
    flash(r.matched ? `${r.rows} of ${r.matched} message(s) matching the filter ${past}` +
      (r.rows < r.matched ? " (the others: a dedupe key a live message carries, or changed meanwhile)" : "")
      : `no ${statuses} message matches the filter: nothing ${past}`);
    await refresh();
  });
}

async function message(id) {
  let d;
  try { d = await getJSON("/api/message/" + id); } catch (e) {
    main.innerHTML = `<section><h2>Message #${esc(id)}</h2><p class="error">${esc(e.message)}</p></section>`;
    return;
  }
  const m = d.message;
  const st = m.state || {};
  const kind = kindOf(m);
  const errors = ["error", "dispatch_error", "pause_reason", "previous_error"].filter((k) => k in st)
    .map((k) => `<tr><th>${k.replace("_", " ")}</th><td><pre>${esc(JSON.stringify(st[k], null, 1))}</pre></td></tr>`).join("");
  const canRequeue = ["failed", "timeout", "expired"].includes(m.status);
  const canCancel = ["pending", "paused"].includes(m.status);
  const canRunNow = m.status === "paused";
  const hist = m.history;
  const retries = m.max_retries != null ? `${m.retries} of ${m.max_retries} (MAX_RETRIES)` : `${m.retries}`;
  main.innerHTML = `<section><h2>Message #${m.workqueue_id}</h2>
    <p>${ALLOW ? `<button id="btn-requeue" ${canRequeue ? "" : "disabled"}>Requeue</button>
      <button id="btn-cancel" class="danger" ${canCancel ? "" : "disabled"}>Cancel</button>
      <button id="btn-run-now" ${canRunNow ? "" : "disabled"} title="reschedule: due now, no retry counted for it">Run now</button>` :
      '<span class="muted">read-only (start pepsi-httpd with --allow-actions for buttons)</span>'}
      <span id="msg-result" class="result"></span></p>
    <table id="message"><tbody>
    <tr><th>status</th><td><span id="msg-status" class="badge ${esc(kind.replace(" ", "-"))}"
      title="status ${esc(m.status)}">${esc(kind)}</span>${kind !== m.status ? ` <span class="muted">(status ${esc(m.status)})</span>` : ""}</td></tr>
    <tr><th>stage</th><td id="msg-stage">${esc(m.stage)}</td></tr>
    <tr><th>retries</th><td id="msg-retries">${esc(retries)}</td></tr>
    <tr><th>priority</th><td id="msg-priority">${esc(m.priority ?? 0)}</td></tr>
    <tr><th>dedupe key</th><td id="msg-dedupe-key">${m.dedupe_key == null ? '<span class="muted">none</span>' : esc(m.dedupe_key)}</td></tr>
    ${m.status === "paused" ? `<tr><th>due</th><td id="msg-due">${ts(m.timeout)}</td></tr>` : ""}
    ${errors || '<tr><th>errors</th><td class="muted">none</td></tr>'}
    <tr><th>created</th><td>${ts(m.created_at)} (${esc(fmtAge(m.age_seconds))} ago)</td></tr>
    <tr><th>updated</th><td>${ts(m.updated_at)} (${esc(fmtAge(m.idle_seconds))} ago)</td></tr>
    <tr><th>dispatcher</th><td>${esc(m.dispatcher_id ?? "-")}</td></tr>
    <tr><th>payload</th><td><pre id="msg-payload">${esc(JSON.stringify(m.payload, null, 1))}</pre></td></tr>
    <tr><th>state</th><td><pre>${esc(JSON.stringify(st, null, 1))}</pre></td></tr>
    </tbody></table></section>
    ${Array.isArray(hist) ? `<section><h2>History <span class="muted">(the last attempts, oldest first)</span></h2>
      <table id="history"><thead><tr><th>#</th><th>stage</th><th>started</th><th>ended</th><th>outcome</th><th>reason</th></tr></thead>
      <tbody>${hist.map((a) => `<tr data-outcome="${esc(a.outcome)}"><td>${esc(a.attempt ?? "")}</td><td>${esc(a.stage)}</td><td>${ts(a.started_at)}</td>
        <td>${ts(a.ended_at)}</td><td>${badge(String(a.outcome || "?"))}</td>
        <td>${esc(a.reason ?? "")}${a.traceback ? `<details><summary>traceback</summary><pre>${esc(a.traceback)}</pre></details>` : ""}</td></tr>`).join("") ||
        '<tr><td colspan="6" class="muted">no attempts recorded</td></tr>'}</tbody></table></section>` : ""}`;
  const rq = document.getElementById("btn-requeue");
  if (rq) rq.onclick = () => guarded(async () => {
    const r = await act("/api/requeue", { ids: [m.workqueue_id] }, `Requeue message #${m.workqueue_id}?`);
    if (r) { flash(`${r.rows} requeued`); await refresh(); }
  });
  const rn = document.getElementById("btn-run-now");
  if (rn) rn.onclick = () => guarded(async () => {
    const r = await act("/api/reschedule", { id: m.workqueue_id, in_seconds: 0 }, `Run message #${m.workqueue_id} now (reschedule it)?`);
    if (r) { flash(`#${m.workqueue_id} due now`); await refresh(); }
  });
  const cx = document.getElementById("btn-cancel");
  if (cx) cx.onclick = () => guarded(async () => {
    const r = await act("/api/cancel", { ids: [m.workqueue_id] }, `Cancel message #${m.workqueue_id}? It becomes failed ('cancelled by operator').`);
    if (r) { flash(`${r.rows} cancelled`); await refresh(); }
  });
}

// Every table in a box of its own that scrolls sideways: a narrow window scrolls
// the table, never the page.
function scrollTables() {
  for (const t of main.querySelectorAll("table")) {
    if (t.parentElement.classList.contains("table-wrap")) continue;
    const box = document.createElement("div");
    box.className = "table-wrap";
    t.replaceWith(box);
    box.append(t);
  }
}
let lastFlash = "";
function flash(text) { lastFlash = text; }
async function guarded(fn) {
  try { await fn(); } catch (e) { setStatus(false, "action failed: " + e.message); }
}
// The list views are not re-rendered by the timer (checkboxes and filters stay as set).
function live(path) { return path === "/" || path.startsWith("/message/"); }
let busy = false;
// The server's 404 page: its main says so; only the banner is ours to draw.
const NOT_FOUND = main.dataset.page === "not-found";
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const path = location.pathname;
    const d = await getJSON("/api/overview");
    banner(d); // on every page: no dispatcher, stages held off
    let m;
    if (NOT_FOUND) { /* the server wrote the page */ }
    else if (path === "/failures") await failures(d);
    else if (path === "/messages") await messages();
    else if ((m = path.match(/^\/message\/(\d+)$/))) await message(m[1]);
    else await overview(d);
    scrollTables();
    const r = document.getElementById("msg-result");
    if (r && lastFlash) r.textContent = lastFlash;
    setStatus(true, "updated " + fmtTime(Date.now() / 1000));
  } catch (e) {
    setStatus(false, "error: " + e.message);
  } finally {
    busy = false;
  }
}
for (const a of document.querySelectorAll("header nav a")) {
  if (a.getAttribute("href") === location.pathname) a.classList.add("active");
}
document.getElementById("search").onsubmit = (ev) => {
  ev.preventDefault();
  const v = document.getElementById("search-id").value.trim().replace(/^#/, "");
  if (/^\d+$/.test(v)) location.href = "/message/" + v;
  else setStatus(false, "a message id is a number");
};
window.onpopstate = refresh;
document.getElementById("mode").textContent = ALLOW ? "actions allowed" : "read-only";
refresh();
setInterval(() => { if (live(location.pathname)) refresh(); }, REFRESH_MS);
