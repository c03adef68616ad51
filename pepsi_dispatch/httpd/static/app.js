// pepsi-httpd dashboard: one page, three views, refreshed every 2 s from the JSON API.
// No framework, no CDN: plain DOM and an SVG drawn here.
"use strict";

const ALLOW = document.body.dataset.allowActions === "true";
const REFRESH_MS = 2000;
const main = document.getElementById("main");
const statusEl = document.getElementById("status");

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmtAge(s) {
  if (s == null) return "–";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function fmtTime(epoch) {
  return epoch == null ? "–" : new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19);
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
    pos[n] = { x: 20 + d * 240, y: 20 + (rows[d] - 1) * 110 };
  }
  const h = 30 + Math.max(1, ...Object.values(rows)) * 110;
  const w = 40 + (Math.max(0, ...Object.values(depth)) + 1) * 240;
  return { pos, w, h };
}
function graphSVG(data) {
  const stages = data.stages;
  const { pos, w, h } = layout(stages);
  const NW = 190, NH = 84;
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
    nodes += `<g class="node${s.paused ? " paused" : ""}" data-node="${esc(n)}" transform="translate(${p.x},${p.y})">
      <rect width="${NW}" height="${NH}"></rect>
      <text class="title" x="10" y="20">${esc(n)}${s.paused ? " ⏸ paused" : ""}</text>
      <text x="10" y="40">pending ${c.pending || 0} · running ${c.running || 0}</text>
      <text x="10" y="58">paused ${c.paused || 0} · failed ${c.failed || 0}</text>
      <text x="10" y="76" class="muted" font-size="11">oldest pending ${esc(fmtAge(data.oldest_pending[n]))}</text>
    </g>`;
  }
  return `<svg id="graph-svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="stage graph">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
    <path d="M0,0 L10,5 L0,10 z" fill="#8993a4"/></marker></defs>${edges}${nodes}</svg>`;
}

// -- throughput chart from the ring of samples -----------------------------------------
function rates(samples) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    out.push({ t: b.t, p: Math.max(0, b.processed - a.processed) / dt,
               f: Math.max(0, b.failed - a.failed) / dt });
  }
  return out;
}
function chartSVG(samples) {
  const W = 760, H = 160, L = 50, B = 20;
  const r = rates(samples);
  if (r.length < 2) return `<p class="muted">collecting samples…</p>`;
  const t0 = r[0].t, t1 = r[r.length - 1].t;
  const max = Math.max(1, ...r.map((x) => Math.max(x.p, x.f)));
  const X = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - 10);
  const Y = (v) => H - B - (v / max) * (H - B - 10);
  const line = (k) => r.map((x, i) => (i ? "L" : "M") + X(x.t).toFixed(1) + "," + Y(x[k]).toFixed(1)).join(" ");
  return `<svg id="chart-svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">
    <line class="grid" x1="${L}" y1="${Y(max)}" x2="${W}" y2="${Y(max)}"/>
    <line class="grid" x1="${L}" y1="${Y(0)}" x2="${W}" y2="${Y(0)}"/>
    <text x="4" y="${Y(max) + 4}">${max.toFixed(1)}/s</text><text x="4" y="${Y(0) + 4}">0</text>
    <text x="${L}" y="${H - 4}">${fmtTime(t0).slice(11)}</text>
    <text x="${W - 60}" y="${H - 4}">${fmtTime(t1).slice(11)}</text>
    <path class="line-processed" d="${line("p")}"/><path class="line-failed" d="${line("f")}"/></svg>`;
}

// -- views ---------------------------------------------------------------------------
async function overview() {
  const d = await getJSON("/api/overview");
  const stats = Object.fromEntries(d.stage_stats.map((s) => [s.stage, s]));
  const names = [...new Set([...Object.keys(d.stages), ...Object.keys(d.counts)])];
  const rows = names.map((n) => {
    const c = d.counts[n] || {};
    const s = stats[n] || {};
    const st = d.stages[n];
    const paused = st && st.paused;
    const btn = st ? `<button id="pause-${esc(n)}" data-stage="${esc(n)}" data-paused="${paused ? "1" : "0"}"
        class="pause" ${ALLOW ? "" : "disabled hidden"}>${paused ? "Resume" : "Pause"}</button>` : "";
    return `<tr data-stage="${esc(n)}"><td>${esc(n)}${paused ? ' <span class="badge paused">paused</span>' : ""}
      ${st ? "" : ' <span class="muted">(not configured)</span>'}</td>
      ${["pending", "running", "paused", "failed", "done"].map((k) =>
        `<td class="num" data-count="${k}">${c[k] || 0}</td>`).join("")}
      <td class="num" data-oldest>${esc(fmtAge(d.oldest_pending[n]))}</td>
      <td class="num" data-due>${d.retries_due[n] || 0}</td>
      <td class="num" data-processed>${s.processed ?? 0}</td>
      <td class="num">${(s.failed ?? 0) + (s.timeouts ?? 0) + (s.crashes ?? 0)}</td>
      <td>${btn}</td></tr>`;
  }).join("");
  const disp = d.dispatchers.map((x) => `<tr data-dispatcher="${x.dispatcher_id}">
      <td>${x.dispatcher_id}</td><td>${esc(x.hostname)}</td><td>${x.pid}</td>
      <td>${x.live ? '<span class="badge done">live</span>' : '<span class="badge failed">stale</span>'}</td>
      <td class="num">${esc(fmtAge(x.heartbeat_age))}</td>
      <td>${esc(Object.entries(x.workers || {}).map(([s, w]) =>
        `${s}: ${w.busy} busy, ${w.idle} idle`).join("; ") || "–")}</td></tr>`).join("");
  const t = d.totals;
  main.innerHTML = `
    ${d.config_error ? `<p class="error">${esc(d.config_error)}</p>` : ""}
    <section id="graph"><h2>Stage graph</h2>${Object.keys(d.stages).length ? graphSVG(d) :
      '<p class="muted">no stages configured (start pepsi-httpd with -c FILE)</p>'}</section>
    <section><h2>Stages</h2><table id="stages"><thead><tr><th>stage</th><th class="num">pending</th>
      <th class="num">running</th><th class="num">paused</th><th class="num">failed</th><th class="num">done</th>
      <th class="num">oldest pending</th><th class="num">retries due</th><th class="num">processed</th>
      <th class="num">failures</th><th></th></tr></thead><tbody>${rows}</tbody></table></section>
    <section id="throughput"><h2>Throughput (messages/s, from the stage statistics)</h2>
      <div class="legend"><span class="p">━ processed</span><span class="f">━ failed, timed out, crashed</span>
      <span class="muted">totals: <b id="total-messages">${t.messages ?? 0}</b> handed out,
      <b id="total-runs">${t.stage_runs ?? 0}</b> stage runs, <b id="total-failed">${t.failed ?? 0}</b> failed,
      <b id="total-requeued">${t.requeued ?? 0}</b> requeued</span></div>
      ${chartSVG(d.samples)}</section>
    <section><h2>Failures by reason</h2>${reasonsTable(d.failure_reasons.slice(0, 5))}
      <p><a href="/failures">all failures →</a></p></section>
    <section><h2>Dispatchers</h2><table id="dispatchers"><thead><tr><th>id</th><th>host</th><th>pid</th>
      <th>state</th><th class="num">heartbeat</th><th>workers</th></tr></thead><tbody>${disp ||
      '<tr><td colspan="6" class="muted">none registered</td></tr>'}</tbody></table></section>`;
  for (const b of main.querySelectorAll("button.pause")) {
    b.onclick = () => guarded(async () => {
      const pause = b.dataset.paused !== "1";
      const r = await act("/api/pause", { stage: b.dataset.stage, paused: pause },
        `${pause ? "Pause" : "Resume"} stage ${b.dataset.stage}?` +
        (pause ? " Running messages finish; nothing new is claimed." : ""));
      if (r) await refresh();
    });
  }
}
function reasonsTable(reasons) {
  if (!reasons.length) return '<p class="muted" id="no-failures">no failed messages</p>';
  return `<table class="reasons"><thead><tr><th>stage</th><th>reason</th><th class="num">messages</th>
    <th class="num">newest</th></tr></thead><tbody>${reasons.map((r) => `<tr class="reason"
      data-stage="${esc(r.stage)}" data-reason="${esc(r.reason)}"><td>${esc(r.stage)}</td>
      <td><a class="reason-link" href="/failures?stage=${encodeURIComponent(r.stage)}&reason=${encodeURIComponent(r.reason)}">${esc(r.reason)}</a></td>
      <td class="num" data-count>${r.count}</td>
      <td class="num"><a href="/message/${r.newest_id}">#${r.newest_id}</a></td></tr>`).join("")}</tbody></table>`;
}
async function failures() {
  const q = new URLSearchParams(location.search);
  if (!q.has("reason") && !q.has("stage")) {
    const d = await getJSON("/api/overview");
    main.innerHTML = `<section><h2>Failures by reason</h2>${reasonsTable(d.failure_reasons)}</section>`;
    return;
  }
  const d = await getJSON("/api/failures?" + q.toString());
  const ids = d.rows.map((r) => r.workqueue_id);
  main.innerHTML = `<section><h2>Failed messages${q.get("stage") ? " of stage " + esc(q.get("stage")) : ""}
    ${q.has("reason") ? ": " + esc(q.get("reason")) : ""}</h2>
    <p><a href="/failures">← all reasons</a>
    ${ALLOW && ids.length ? ` <button id="requeue-all">Requeue these ${ids.length}</button>` : ""}</p>
    <table id="failed"><thead><tr><th>id</th><th>stage</th><th>status</th><th class="num">retries</th>
    <th>error</th><th>updated</th></tr></thead><tbody>${d.rows.map((r) => `<tr data-id="${r.workqueue_id}">
    <td><a href="/message/${r.workqueue_id}">#${r.workqueue_id}</a></td><td>${esc(r.stage)}</td>
    <td><span class="badge ${esc(r.status)}">${esc(r.status)}</span></td><td class="num">${r.retries}</td>
    <td>${esc(r.error)}</td><td>${fmtTime(r.updated_at)}</td></tr>`).join("") ||
    '<tr><td colspan="6" class="muted">none</td></tr>'}</tbody></table></section>`;
  const all = document.getElementById("requeue-all");
  if (all) all.onclick = () => guarded(async () => {
    const r = await act("/api/requeue", { ids }, `Requeue ${ids.length} failed message(s)?`);
    if (r) { flash(`${r.rows} message(s) requeued`); await refresh(); }
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
  const errors = ["error", "dispatch_error", "previous_error"].filter((k) => k in st)
    .map((k) => `<tr><th>${k}</th><td><pre>${esc(JSON.stringify(st[k], null, 1))}</pre></td></tr>`).join("");
  const canRequeue = ["failed", "timeout", "expired"].includes(m.status);
  const canCancel = ["pending", "paused"].includes(m.status);
  main.innerHTML = `<section><h2>Message #${m.workqueue_id}</h2>
    <p>${ALLOW ? `<button id="btn-requeue" ${canRequeue ? "" : "disabled"}>Requeue</button>
      <button id="btn-cancel" class="danger" ${canCancel ? "" : "disabled"}>Cancel</button>` :
      '<span class="muted">read-only (start pepsi-httpd with --allow-actions for buttons)</span>'}
      <span id="msg-result"></span></p>
    <table id="message"><tbody>
    <tr><th>status</th><td><span id="msg-status" class="badge ${esc(m.status)}">${esc(m.status)}</span></td></tr>
    <tr><th>stage</th><td id="msg-stage">${esc(m.stage)}</td></tr>
    <tr><th>retries</th><td id="msg-retries">${m.retries}</td></tr>
    ${errors || '<tr><th>errors</th><td class="muted">none</td></tr>'}
    <tr><th>created</th><td>${esc(m.created_at)} (${esc(fmtAge(m.age_seconds))} ago)</td></tr>
    <tr><th>updated</th><td>${esc(m.updated_at)} (${esc(fmtAge(m.idle_seconds))} ago)</td></tr>
    <tr><th>timeout</th><td>${esc(m.timeout ?? "–")}</td></tr>
    <tr><th>dispatcher</th><td>${esc(m.dispatcher_id ?? "–")}</td></tr>
    <tr><th>payload</th><td><pre id="msg-payload">${esc(JSON.stringify(m.payload, null, 1))}</pre></td></tr>
    <tr><th>state</th><td><pre>${esc(JSON.stringify(st, null, 1))}</pre></td></tr>
    </tbody></table></section>`;
  const rq = document.getElementById("btn-requeue");
  if (rq) rq.onclick = () => guarded(async () => {
    const r = await act("/api/requeue", { ids: [m.workqueue_id] }, `Requeue message #${m.workqueue_id}?`);
    if (r) { flash(`${r.rows} requeued`); await refresh(); }
  });
  const cx = document.getElementById("btn-cancel");
  if (cx) cx.onclick = () => guarded(async () => {
    const r = await act("/api/cancel", { ids: [m.workqueue_id] }, `Cancel message #${m.workqueue_id}? It becomes failed ('cancelled by operator').`);
    if (r) { flash(`${r.rows} cancelled`); await refresh(); }
  });
}

let lastFlash = "";
function flash(text) { lastFlash = text; }
async function guarded(fn) {
  try { await fn(); } catch (e) { setStatus(false, "action failed: " + e.message); }
}
let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const path = location.pathname;
    let m;
    if (path === "/failures") await failures();
    else if ((m = path.match(/^\/message\/(\d+)$/))) await message(m[1]);
    else await overview();
    const r = document.getElementById("msg-result");
    if (r && lastFlash) r.textContent = lastFlash;
    setStatus(true, "updated " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus(false, "error: " + e.message);
  } finally {
    busy = false;
  }
}
for (const a of document.querySelectorAll("header nav a")) {
  if (a.getAttribute("href") === location.pathname) a.classList.add("active");
}
document.getElementById("mode").textContent = ALLOW ? "actions allowed" : "read-only";
refresh();
setInterval(refresh, REFRESH_MS);
