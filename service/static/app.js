// The page: polls /routing every refresh_s seconds and redraws. No framework, no network but this server.
"use strict";

const KERNEL_ORDER = ["intree.ragged_prefill", "aiter.pa_prefill_sparse", "aiter.pa_sparse_prefill_opus", "intree.sparse_decode"];
const PREFILL_KERNELS = new Set(["intree.ragged_prefill", "aiter.pa_prefill_sparse", "aiter.pa_sparse_prefill_opus"]);
let refreshMs = 2000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "style") node.setAttribute("style", v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function fmtInt(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(n);
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 2 : 1) + " ms";
  return s.toFixed(2) + " s";
}

// "13.2/24.8 ms": both quantiles in the unit of the larger, so a cell stays narrow.
function fmtPair(a, b) {
  if (a === null || b === null || a === undefined || b === undefined) return "–";
  const [scale, unit] = b < 1e-3 ? [1e6, "µs"] : b < 1 ? [1e3, "ms"] : [1, "s"];
  const f = (x) => { const v = x * scale; return v >= 10 ? v.toFixed(0) : v.toFixed(1); };
  return `${f(a)}/${f(b)} ${unit}`;
}

// Telemetry's counterfactuals: decided on this platform, or on a what-if arch (the demo off gfx942 uses gfx942).
function whatIfSource(data) {
  const cp = data.counterfactual_platform || data.platform;
  const where = cp.what_if ? `a what-if ${cp.arch}${cp.aiter_enabled ? " + AITER" : ""}` : `this platform (${cp.arch})`;
  return { policies: data.counterfactuals, counts: data.would_route, platform: cp, where,
           elsewhere: cp.what_if && cp.arch !== data.platform.arch };
}

// Short enough for the matrix's first column: the name, its gfx942 gate unless the name says it, "(active)" for the active gate.
function policyLabel(p, active) {
  if (active && p.gfx942_min_rows === active.gfx942_min_rows && p.gfx950_min_rows === active.gfx950_min_rows) return `${p.name} (active)`;
  if (p.name === "no_row_gate" || p.name === `gfx942_${p.gfx942_min_rows}`) return p.name;
  return `${p.name} (${p.gfx942_min_rows > 0 ? "≥ " + p.gfx942_min_rows : "no row gate"})`;
}

function shortKernel(k) {
  return {
    "aiter.pa_prefill_sparse": { name: "aiter", cls: "aiter" },
    "aiter.pa_sparse_prefill_opus": { name: "opus", cls: "aiter" },
    "intree.ragged_prefill": { name: "in-tree", cls: "intree" },
    "intree.sparse_decode": { name: "split-K", cls: "intree" },
  }[k] || { name: k, cls: "" };
}

function bucketLow(label) {
  return parseInt(label, 10);
}

function kernelRank(k) {
  const i = KERNEL_ORDER.indexOf(k);
  return i < 0 ? KERNEL_ORDER.length : i;
}

// Buckets from the first to the last one holding any call, so every model's matrix has the same columns.
function shownBuckets(data) {
  const used = new Set();
  for (const r of data.counts) used.add(r.rows_bucket);
  for (const r of whatIfSource(data).counts) used.add(r.rows_bucket);
  const all = data.rows_buckets.filter((b) => b !== "0" || used.has(b));
  const idx = all.map((b, i) => (used.has(b) ? i : -1)).filter((i) => i >= 0);
  if (!idx.length) return all.slice(1, 13);
  return all.slice(Math.min(...idx), Math.max(...idx) + 1);
}

function gateEdges(policy) {
  const edges = new Map();
  if (policy.gfx942_min_rows > 0) edges.set(policy.gfx942_min_rows, "gfx942 gate");
  if (policy.gfx950_min_rows > 0) edges.set(policy.gfx950_min_rows, (edges.get(policy.gfx950_min_rows) ? edges.get(policy.gfx950_min_rows) + " · " : "") + "gfx950 gate");
  return edges;
}

function header(data, buckets) {
  const edges = gateEdges(data.policy);
  const row = el("tr", {}, el("th", { class: "kernel", text: "kernel \\ rows per call" }));
  for (const b of buckets) {
    const gate = edges.get(bucketLow(b));
    row.append(el("th", { class: gate ? "gate" : null, title: gate ? `${gate}: rows >= ${bucketLow(b)}` : null },
      b, gate ? el("span", { class: "edge", text: "▲ " + gate.replace(/ gate/g, "") }) : null));
  }
  return el("thead", {}, row);
}

function cellShade(share) {
  const a = share > 0 ? 0.07 + 0.55 * Math.sqrt(share) : 0;
  return a ? `background: rgba(37, 99, 235, ${a.toFixed(3)}); color: ${a > 0.42 ? "#fff" : "inherit"}` : null;
}

function modelPanel(data, model, buckets) {
  const counts = data.counts.filter((r) => r.model === model);
  const total = counts.reduce((a, r) => a + r.calls, 0);
  const cell = new Map(); // kernel|bucket -> {calls, dip}
  for (const r of counts) {
    const key = r.kernel + "|" + r.rows_bucket;
    const c = cell.get(key) || { calls: 0, dip: 0 };
    c.calls += r.calls;
    if (PREFILL_KERNELS.has(r.kernel) && (r.call_class === "mixed" || r.call_class === "pure_decode")) c.dip += r.calls;
    cell.set(key, c);
  }
  const lat = new Map(data.latency.filter((r) => r.model === model).map((r) => [r.kernel + "|" + r.rows_bucket, r]));
  const kernels = [...new Set(counts.map((r) => r.kernel))].sort((a, b) => kernelRank(a) - kernelRank(b));
  const body = el("tbody");
  for (const k of kernels) {
    const tr = el("tr", { "data-kernel": k }, el("td", { class: "kernel", text: k }));
    for (const b of buckets) {
      const c = cell.get(k + "|" + b);
      if (!c || !c.calls) { tr.append(el("td", { class: "empty", "data-kernel": k, "data-bucket": b, "data-calls": 0, text: "·" })); continue; }
      const share = total ? c.calls / total : 0;
      const l = lat.get(k + "|" + b);
      const td = el("td", {
        class: c.dip ? "dip" : null, style: cellShade(share), "data-kernel": k, "data-bucket": b, "data-calls": c.calls,
        title: `${c.calls} calls, ${(share * 100).toFixed(1)}% of ${model}'s calls` + (l ? `; p50 ${fmtSeconds(l.p50_s)}, p99 ${fmtSeconds(l.p99_s)} from ${l.samples} timed calls` : ""),
      }, el("span", { class: "n", text: fmtInt(c.calls) }));
      if (l && l.samples) td.append(el("span", { class: "lat", text: fmtPair(l.p50_s, l.p99_s) }));
      if (c.dip) td.append(el("span", { class: "dipn", "data-dip": c.dip, text: `${fmtInt(c.dip)} decode` }));
      tr.append(td);
    }
    body.append(tr);
  }
  if (!kernels.length) body.append(el("tr", {}, el("td", { class: "empty", colspan: buckets.length + 1, text: "no calls yet" })));
  const wi = whatIfSource(data);
  const wiRows = wi.counts.filter((r) => r.model === model);
  if (wiRows.length) {
    body.append(el("tr", { class: "whatif-head" }, el("td", { colspan: buckets.length + 1,
      text: `counterfactuals on ${wi.where}: where the same calls would go under each policy (never launched)` })));
  }
  for (const p of wi.policies) {
    const rows = wiRows.filter((r) => r.policy === p.name);
    if (!rows.length) continue;
    const tr = el("tr", { class: "whatif", "data-policy": p.name }, el("td", { class: "kernel", text: "→ " + policyLabel(p, data.policy),
      title: `${p.name}: gfx942 ≥ ${p.gfx942_min_rows}, gfx950 ≥ ${p.gfx950_min_rows}, decided on ${p.platform || wi.platform.arch}` }));
    for (const b of buckets) {
      const hit = rows.filter((r) => r.rows_bucket === b).sort((x, y) => kernelRank(x.kernel) - kernelRank(y.kernel));
      if (!hit.length) { tr.append(el("td", { class: "empty", text: "·" })); continue; }
      const dip = hit.reduce((a, r) => a + (r.decode_in_prefill_calls || 0), 0);
      const td = el("td", { class: dip ? "dip" : null, "data-bucket": b,
        title: hit.map((r) => `${r.calls} calls → ${r.kernel}` + (r.decode_in_prefill_calls ? ` (${r.decode_in_prefill_calls} with decode rows)` : "")).join("\n") });
      for (const r of hit) td.append(el("span", { class: "wk " + shortKernel(r.kernel).cls, text: `${fmtInt(r.calls)} ${shortKernel(r.kernel).name}` }));
      if (dip) td.append(el("span", { class: "dipn", text: `${fmtInt(dip)} decode` }));
      tr.append(td);
    }
    body.append(tr);
  }
  const dip = (data.decode_in_prefill.by_model || []).find((r) => r.model === model);
  const dp = (data.decode_path || []).find((r) => r.model === model);
  const head = el("div", { class: "model-head" }, el("h2", { text: model }), el("span", { class: "badge", text: `${fmtInt(total)} prefill-entry calls` }));
  head.append(el("span", { class: "badge", text: `${fmtInt(dp ? dp.calls : 0)} decode-entry calls` }));
  if (dip && dip.calls) {
    head.append(el("span", { class: "badge bad", "data-dip-model": model, text: `decode-in-prefill: ${fmtInt(dip.calls)} calls, ${fmtInt(dip.decode_rows)} decode rows` }));
  } else if (total) {
    head.append(el("span", { class: "badge ok", text: "no decode rows in prefill" }));
  }
  return el("section", { class: "panel" }, head,
    el("div", { class: "scroll" }, el("table", { class: "matrix", "data-model": model }, header(data, buckets), body)),
    el("div", { class: "hint legend", text: "cell: calls (shade = share of this model's calls), then p50/p99 latency of timed calls; red outline, 'N decode': calls carrying decode rows that a prefill kernel (no split-K) ran" }));
}

function facts(data) {
  const p = data.platform, pol = data.policy;
  const aiter = p.aiter_importable ? `importable${p.aiter_version ? " " + p.aiter_version : ""}` : `not importable: ${p.aiter_reason}`;
  const node = el("div");
  node.append("platform ", el("b", { text: `${p.arch}` }), ` (${p.vendor}${p.device_name ? ", " + p.device_name : ""}) · AITER `,
    el("b", { text: p.aiter_enabled ? "enabled" : "disabled" }), `, ${aiter} · policy gfx942 ≥ `, el("b", { text: String(pol.gfx942_min_rows) }),
    ", gfx950 ≥ ", el("b", { text: String(pol.gfx950_min_rows) }), ", guard ", el("b", { text: pol.guard }),
    ` · rank ${data.service.rank} · timing ${data.timing || "?"}`);
  return node;
}

function notes(data) {
  const demo = data.demo, dn = document.getElementById("demo-note"), wn = document.getElementById("whatif-note");
  if (demo) {
    const scale = demo.scaled
      ? `scaled down: per-row work is 1/${Math.round(demo.scale_factor)} of the real models (${demo.shapes.map((s) => `${s.model}: ${s.heads} heads, head dim ${s.nope_head_dim}+${s.rope_head_dim}, top-k ${s.topk}`).join("; ")}); rows per call are the real ones`
      : "at full model shapes";
    dn.textContent = `Demo workload ${demo.state} on ${demo.device}, ${scale}. ` +
      `GLM decode bug ${demo.glm_bug ? "ON (decode rows sent through the prefill entry)" : "off (decode steps use the decode entry)"}.`;
    dn.hidden = false;
  } else dn.hidden = true;
  const wi = whatIfSource(data);
  if (wi.policies.length) {
    const list = wi.policies.map((p) => policyLabel(p, data.policy)).join("; ");
    const cp = wi.platform;
    wn.textContent = cp.what_if
      ? `What-if rows decide the same calls again on a what-if ${cp.arch}${cp.aiter_enabled ? " with AITER enabled" : ""}, under each policy: ${list}. ` +
        (wi.elsewhere ? `They are never launches: this machine is ${data.platform.arch}, and nothing ran on ${cp.arch}.` : "They are never launches.")
      : `What-if rows (${list}) are counterfactuals decided on ${cp.arch}: ` +
        `where the same calls would have gone under that policy. They are never launches.`;
    wn.hidden = false;
  } else wn.hidden = true;
}

function cards(data) {
  const total = data.counts.reduce((a, r) => a + r.calls, 0);
  const dip = data.decode_in_prefill;
  const dp = (data.decode_path || []).reduce((a, r) => a + r.calls, 0);
  const h = data.health;
  const errs = Object.values(h.telemetry_errors || {}).reduce((a, b) => a + b, 0) + data.errors.reduce((a, r) => a + r.calls, 0);
  const card = (k, v, bad, id) => el("div", { class: "card" + (bad ? " bad" : ""), id }, el("div", { class: "v", text: v }), el("div", { class: "k", text: k }));
  return [
    card("prefill-entry calls", fmtInt(total), false, "card-calls"),
    card("decode-in-prefill calls", fmtInt(dip.calls), dip.calls > 0, "card-dip"),
    card("decode-entry calls", fmtInt(dp), false, "card-decode"),
    card("kernel + telemetry errors", fmtInt(errs), errs > 0, "card-errors"),
    card("last flush", h.last_flush_ts ? `${Math.max(0, data.service.ts - h.last_flush_ts).toFixed(1)} s ago` : "–", false, "card-flush"),
  ];
}

function decisions(data) {
  const tbody = document.querySelector("#decisions tbody");
  tbody.replaceChildren(...data.decisions.slice(0, 20).map((d) => {
    const dip = PREFILL_KERNELS.has(d.kernel) && (d.call_class === "mixed" || d.call_class === "pure_decode");
    const t = new Date(d.ts * 1000);
    return el("tr", { class: dip ? "dip" : null },
      el("td", { class: "mono", text: t.toLocaleTimeString([], { hour12: false }) + "." + String(t.getMilliseconds()).padStart(3, "0") }),
      el("td", { text: d.model }), el("td", { class: "mono", text: String(d.rows) }),
      el("td", { text: d.call_class + (d.decode_rows ? ` (${d.decode_rows} decode)` : "") }),
      el("td", { class: "mono", text: d.kernel }), el("td", { class: "reason", text: d.reason }));
  }));
}

// The advice panel: what each policy would cost on the traffic seen, and its saving against the active one (band).
function fmtBand(b, perHour) {
  if (!b) return null;
  const unit = perHour ? "/h" : "";
  return [fmtSeconds(Math.abs(b.mid)) + unit, `${fmtSigned(b.low)} … ${fmtSigned(b.high)}${unit}`, b.mid < 0];
}

function fmtSigned(s) {
  return (s < 0 ? "−" : "") + fmtSeconds(Math.abs(s));
}

function bandCell(b, perHour, signed) {
  const f = fmtBand(b, perHour);
  if (!f) return el("td", { class: "num", text: "–" });
  return el("td", { class: "num", "data-mid": b.mid }, (signed && f[2] ? "costs " : signed ? "saves " : "") + f[0],
    el("span", { class: "band", text: `(${f[1]})` }));
}

const ADVICE_ROWS = ["active", "counterfactual", "guard"];

function adviceModel(m, hourly) {
  const shown = m.candidates.filter((c) => ADVICE_ROWS.includes(c.kind) || c.name === m.best || (c.name === "fix_all" && c.moved_calls));
  const body = el("tbody");
  for (const c of shown) {
    const cls = c.name === m.best ? "best" : c.kind === "fix" ? "fix" : null;
    const what = c.kind === "fix" ? "decode rows never in a prefill kernel (all to the decode entry)" : c.label;
    const saving = c.kind === "active" ? el("td", { class: "num", text: "–" })
      : !c.moved_calls ? el("td", { class: "num", text: "no call moves" })
      : c.saving ? bandCell(hourly ? c.saving_per_hour : c.saving, hourly, true) : el("td", { class: "num", text: c.saving_note || "unknown" });
    body.append(el("tr", { class: cls, "data-policy": c.name },
      el("td", { class: "mono", text: c.name + (c.name === m.best ? " ★" : "") }), el("td", { class: "what", text: what }),
      bandCell(hourly ? c.seconds_per_hour : c.seconds, hourly, false), saving,
      el("td", { class: "num", text: c.saving_share ? `${(c.saving_share.mid * 100).toFixed(2)}%` : "–" }),
      el("td", { class: "num", text: `${fmtInt(c.moved_calls)}` + (c.calls > c.covered_calls ? ` · ${fmtInt(c.calls - c.covered_calls)} unpriced` : "") })));
  }
  const per = hourly ? "per hour" : "over the traffic";
  const table = el("table", { class: "advice-table", "data-advice-model": m.model },
    el("thead", {}, el("tr", {}, el("th", { text: "policy" }), el("th", { text: "what" }), el("th", { text: `prefill-entry kernel time ${per} (band)` }),
      el("th", { text: `against the active policy ${per} (band)` }), el("th", { text: "share of prefill-entry kernel time" }), el("th", { text: "moved calls" }))), body);
  // One line per model (its headline); the table and the decode-in-prefill cost fold below it.
  const node = el("details", { class: "advice-model", "data-advice-model": m.model },
    el("summary", {}, el("span", { class: "headline" + (m.best ? " has-best" : ""), "data-advice-headline": m.model, text: m.headline })),
    el("div", { class: "scroll" }, table));
  const d = m.decode_in_prefill;
  if (d.calls) {
    const cost = hourly ? d.cost_per_hour : d.cost;
    node.append(el("p", { class: "dipcost", "data-dip-cost": m.model, "data-mid": cost ? cost.mid : "" },
      `decode-in-prefill: ${fmtInt(d.calls)} calls (${fmtInt(d.decode_rows)} decode rows) cost ` +
      (cost ? `${fmtSigned(cost.mid)}${hourly ? "/h" : ""} (${fmtSigned(cost.low)} … ${fmtSigned(cost.high)})` : "an unknown amount") + ` — ${d.note}`));
  }
  return node;
}

function fmtBytes(n) {  // as dispatcher/pools.py's format_bytes: 8388608 -> "8 MiB"
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [unit, size] of units) {
    if (n >= size) { const v = n / size; return `${Number.isInteger(v) ? v : Number(v.toPrecision(3))} ${unit}`; }
  }
  return `${n} B`;
}

function tablePools(t) {  // a table names the kv pools it times beside its device and date (advise.tables.TableMeta)
  const pools = t.kv_pools || [];
  return pools.length ? `, kv pool${pools.length > 1 ? "s" : ""} ${pools.map(fmtBytes).join(", ")}` : "";
}

function advice(data) {
  const sec = document.getElementById("advice"), a = data.advice;
  if (!a) { sec.hidden = true; return; }
  sec.hidden = false;
  const src = document.getElementById("advice-source");
  src.setAttribute("data-status", a.status);
  src.setAttribute("data-what-if", String(!!(a.target && a.target.what_if)));  // priced as if on another device
  if (a.status !== "ok") {
    src.className = "note " + (a.status === "error" ? "bad" : "whatif");
    src.textContent = `No figure: ${a.message}`;
    document.getElementById("advice-models").replaceChildren(el("p", { class: "headline", text: `No figure: ${a.message}` }));
    return;
  }
  src.className = "note whatif";
  const tables = a.tables.map((t) => `${t.name} (${t.device}, ${t.date}${tablePools(t)}, ${t.provenance})`).join("; ");
  src.textContent = `Predicted from ${tables}: the calls seen times the table's per-call times, never a measurement. ` +
    [a.target && a.target.note, ...a.notes, a.band].filter(Boolean).map((n) => n[0].toUpperCase() + n.slice(1) + ".").join(" ");
  const hourly = !!a.source.span_s;
  const box = document.getElementById("advice-models");
  const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.getAttribute("data-advice-model")));
  box.replaceChildren(...a.models.map((m) => adviceModel(m, hourly)));
  for (const d of box.querySelectorAll("details")) if (open.has(d.getAttribute("data-advice-model"))) d.open = true;  // a fold stays open
}

function render(data) {
  refreshMs = Math.max(500, (data.service.refresh_s || 2) * 1000);
  document.getElementById("facts").replaceChildren(facts(data));
  notes(data);
  document.getElementById("cards").replaceChildren(...cards(data));
  advice(data);
  const buckets = shownBuckets(data);
  const seen = new Set([...data.counts, ...(data.decode_path || [])].map((r) => r.model));
  const all = [...data.service.models, ...[...seen].filter((m) => !data.service.models.includes(m))];
  const active = all.filter((m) => seen.has(m));
  const models = active.length ? active : all;
  document.getElementById("models").replaceChildren(...models.map((m) => modelPanel(data, m, buckets)));
  const charts = window.routescopeCharts;
  if (charts) {
    charts.rates(document.getElementById("rates-chart"), data.history, data.service.ts);
    charts.latency(document.getElementById("latency-charts"), data.latency, models, shortKernel);
  }
  experiments(data);
  decisions(data);
  const h = data.health, drops = Object.values(h.dropped || {}).reduce((a, b) => a + b, 0);
  document.getElementById("health").textContent = `routescope ${data.service.version} · up ${Math.round(data.service.uptime_s)} s · ` +
    `dropped ${drops} · probe failures ${h.probe_failures}` + (data.demo ? ` · demo launched ${fmtInt(data.demo.prefill_calls)} prefill + ${fmtInt(data.demo.decode_path_calls)} decode calls` : "");
}

// 57b's part (service/static/experiments.js), when it is there and /routing has an experiments list.
function experiments(data) {
  const sec = document.getElementById("experiments");
  const part = window.routescopeExperiments;
  if (!part || typeof part.render !== "function" || !Array.isArray(data.experiments)) { sec.hidden = true; return; }
  sec.hidden = false;
  try {
    part.render(sec, data.experiments, undefined);
  } catch (e) {
    sec.replaceChildren(el("p", { class: "note bad", text: `experiments: ${e.message}` }));
  }
}

async function tick() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("/routing", { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    status.className = "status live";
    status.textContent = "live · updated " + new Date().toLocaleTimeString([], { hour12: false });
  } catch (e) {
    status.className = "status stale";
    status.textContent = "not updating: " + e.message;
  }
  setTimeout(tick, refreshMs);
}

// First paint: the document the server put in the page, then the polling.
function start() {
  let initial = null;
  try {
    const node = document.getElementById("routing-initial");
    initial = node ? JSON.parse(node.textContent) : null;
  } catch (e) {
    initial = null;
  }
  if (initial) {
    render(initial);
    const status = document.getElementById("status");
    status.className = "status live";
    status.textContent = "as of " + new Date(initial.service.ts * 1000).toLocaleTimeString([], { hour12: false });
    setTimeout(tick, refreshMs);
  } else {
    tick();
  }
}

start();
