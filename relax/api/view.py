"""The live view of a run: one self-contained HTML page (inline CSS, JS and SVG; nothing fetched from outside).

Served unauthenticated at `GET /view`: the page itself holds no data. Its script reads the bearer token from
the URL's fragment (`/view#token=<contents of <run_dir>/api_token>`; a fragment never reaches the server, its
logs or a proxy) and polls `GET /status` with it every second, so the data endpoint keeps the API's bearer
auth. Without a token in the fragment the page asks for one.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Relax run</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px/1.4 system-ui,sans-serif;margin:18px;color:#1d232a;background:#f6f7f9}
 h1{font-size:18px;margin:0 0 4px} h2{font-size:14px;margin:18px 0 6px;color:#445}
 .card{background:#fff;border:1px solid #dde;border-radius:6px;padding:10px 14px;margin-bottom:12px}
 .row{display:flex;gap:12px;flex-wrap:wrap} .row>.card{flex:1;min-width:320px}
 .bar{height:14px;background:#e4e7ec;border-radius:3px;overflow:hidden}
 .bar>div{height:100%;background:#3b82f6}
 table{border-collapse:collapse;width:100%} td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eef}
 th{color:#667;font-weight:600} .num{text-align:right;font-variant-numeric:tabular-nums}
 .state{display:inline-block;padding:1px 8px;border-radius:9px;background:#e0e7ff}
 .firing{color:#b91c1c;font-weight:600} .resolved{color:#15803d} .muted{color:#889}
 #err{color:#b91c1c} svg text{font-size:11px;fill:#667}
</style></head>
<body>
<h1 id="title">Relax run</h1>
<div><span id="state" class="state">connecting</span> <span id="updated" class="muted"></span> <span id="err"></span></div>
<div id="ask" class="card" hidden>This page needs the run's API token: open it as
 <code>/view#token=&lt;contents of RUN_DIR/api_token&gt;</code>, or paste it here:
 <input id="tok" size="48"> <button id="go">show</button></div>
<div class="card"><h2>Progress</h2>
 <div id="progress" class="num">-</div><div class="bar"><div id="progress-bar" style="width:0"></div></div>
 <div id="last" class="muted"></div></div>
<div class="row">
 <div class="card"><h2>Reward (mean per step)</h2>
  <svg id="reward-curve" width="560" height="220" viewBox="0 0 560 220" role="img" aria-label="reward curve">
   <rect x="40" y="10" width="510" height="180" fill="#fafbfc" stroke="#dde"/>
   <polyline id="reward-line" fill="none" stroke="#3b82f6" stroke-width="2" points=""/>
   <text id="y-max" x="4" y="16"></text><text id="y-min" x="4" y="192"></text>
   <text id="x-max" x="520" y="208"></text><text x="40" y="208">0</text>
  </svg></div>
 <div class="card"><h2>Per-role utilisation (share of wall time busy)</h2>
  <table id="roles"><thead><tr><th>role</th><th class="num">busy</th><th style="width:50%"></th></tr></thead>
  <tbody></tbody></table></div>
</div>
<div class="row">
 <div class="card"><h2>Recent recoveries</h2><table id="recoveries"><thead><tr><th>role</th><th>tier</th>
  <th>reason</th><th class="num">detected at s</th><th class="num">ready after s</th></tr></thead><tbody></tbody></table></div>
 <div class="card"><h2>Scale operations</h2><table id="scale"><thead><tr><th>kind</th><th>status</th>
  <th class="num">replicas</th><th>engines</th></tr></thead><tbody></tbody></table></div>
</div>
<div class="card"><h2>Alerts</h2><table id="alerts"><thead><tr><th>rule</th><th>state</th><th class="num">after step</th>
 <th>message</th></tr></thead><tbody></tbody></table></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let token = new URLSearchParams(location.hash.slice(1)).get("token");
const fmt = (x, d) => (x === null || x === undefined) ? "" : (typeof x === "number" ? x.toFixed(d) : String(x));
function fill(id, rows) {  // textContent only: nothing from the run is parsed as HTML
  const body = $(id).tBodies[0];
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      if (c instanceof Node) td.append(c); else td.textContent = c;
      if (typeof c === "string" && /^-?[0-9.]+%?$/.test(c)) td.className = "num";
      tr.append(td);
    }
    return tr;
  }));
}
function bar(share) {
  const b = document.createElement("div"); b.className = "bar";
  const f = document.createElement("div"); f.style.width = (100 * Math.min(share, 1)).toFixed(1) + "%";
  b.append(f); return b;
}
function curve(points, total) {
  const ys = points.map((p) => p[1]).filter((y) => y !== null);
  if (!ys.length) { $("reward-line").setAttribute("points", ""); return; }
  let lo = Math.min(...ys), hi = Math.max(...ys);
  if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
  const n = Math.max(total || 0, points.length, 2) - 1;
  $("reward-line").setAttribute("points", points.filter((p) => p[1] !== null).map((p) =>
    (40 + 510 * p[0] / n).toFixed(1) + "," + (190 - 180 * (p[1] - lo) / (hi - lo)).toFixed(1)).join(" "));
  $("y-max").textContent = hi.toFixed(3); $("y-min").textContent = lo.toFixed(3);
  $("x-max").textContent = String(n);
}
function show(s) {
  $("title").textContent = `${s.experiment}/${s.profile}/${s.run}` + (s.mode ? ` (${s.mode})` : "");
  $("state").textContent = s.state + (s.error ? ": " + s.error : "");
  const done = s.steps_done || 0, total = s.steps_total || 0;
  $("progress").textContent = `${done} / ${total} steps`;
  $("progress-bar").style.width = (total ? 100 * done / total : 0).toFixed(1) + "%";
  const last = s.last || {};
  $("last").textContent = Object.keys(last).filter((k) => last[k] !== null)
    .map((k) => `${k} ${typeof last[k] === "number" ? +last[k].toPrecision(4) : last[k]}`).join("  ·  ");
  curve(s.reward || [], total);
  fill("roles", Object.entries(s.busy_share || {}).map(([r, v]) => [r, (100 * v).toFixed(1) + "%", bar(v)]));
  fill("recoveries", (s.recoveries || []).slice().reverse().map((e) => [
    e.role + (e.replica !== null && e.replica !== undefined ? "-" + e.replica : ""), String(e.tier ?? e.kind ?? ""),
    e.reason || e.kind || "", fmt(e.t_detect, 2), fmt(e.ready_s, 2)]));
  fill("scale", (s.scale_operations || []).slice().reverse().map((o) => [o.kind, o.status,
    String(o.num_replicas), (o.engine_ids || []).join(", ")]));
  const alerts = (s.alerts && s.alerts.history) || [];
  fill("alerts", alerts.slice().reverse().map((a) => {
    const st = document.createElement("span"); st.className = a.state; st.textContent = a.state;
    return [a.rule, st, String(a.step), a.message];
  }));
  $("updated").textContent = "updated " + new Date((s.updated_at || 0) * 1000).toLocaleTimeString();
}
async function poll() {
  if (!token) { $("ask").hidden = false; return; }
  try {
    const r = await fetch("status", {headers: {Authorization: "Bearer " + token}, cache: "no-store"});
    if (r.status === 401) { $("err").textContent = "wrong token"; $("ask").hidden = false; return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    show(await r.json()); $("err").textContent = "";
  } catch (e) {  // the run ended (its API is gone) or the network failed: keep the last picture
    $("err").textContent = "no answer from the run (" + e.message + "); retrying";
  }
  setTimeout(poll, 1000);
}
$("go").onclick = () => { token = $("tok").value.trim(); $("ask").hidden = true; poll(); };
poll();
</script></body></html>
"""
