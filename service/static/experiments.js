// The page's experiments part: window.routescopeExperiments.render(container, experiments, history).
// experiments is GET /experiments' list (/routing's `experiments`); history, when given, maps an experiment id to
// its points [{ts, cells: [...]}] (else each experiment's own `history` is used). Per experiment it draws the
// seed's table (B time / A time by rows x top-k, with the anytime-valid band) beside advise's prediction for the
// same cells, and one inline SVG chart per cell of the ratio and its band over time. No library, no network.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const STYLE_ID = "routescope-experiments-style";
  const CSS = `
.exp { border: 1px solid #d4d4d8; border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.exp h3 { margin: 0 0 4px; font-size: 15px; } .exp h4 { margin: 8px 0 2px; font-size: 13px; }
.exp .badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; margin-left: 6px; }
.exp .badge.running { background: #dbeafe; color: #1e40af; } .exp .badge.finished { background: #e4e4e7; }
.exp .badge.stopped { background: #e4e4e7; } .exp .badge.self-stop { background: #fee2e2; color: #991b1b; }
.exp .pair { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.exp table { border-collapse: collapse; font-size: 12px; font-variant-numeric: tabular-nums; width: auto; margin: 0; }
.exp th, .exp td { border: 1px solid #e4e4e7; padding: 2px 6px; text-align: right; }
.exp caption { text-align: left; font-weight: 600; font-size: 12px; padding-bottom: 2px; }
.exp td.better { background: #dcfce7; } .exp td.worse { background: #fee2e2; } .exp td.none { color: #a1a1aa; }
.exp .charts { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 6px; }
.exp svg.exp-chart { border: 1px solid #e4e4e7; background: #fff; }
.exp .note { font-size: 12px; color: #52525b; margin: 2px 0; }`;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);
  const f2 = (v) => (v === null ? "?" : v.toFixed(2));

  // "0.64 [0.60, 0.69]": the ratio and its 95% band; "–" before both arms are timed.
  function band(r, lo, hi) {
    r = num(r); lo = num(lo); hi = num(hi);
    if (r === null) return "–";
    return lo === null && hi === null ? f2(r) : `${f2(r)} [${f2(lo)}, ${f2(hi)}]`;
  }

  // better: the whole band under 1 (B faster); worse: the whole band over 1; otherwise not yet told apart.
  function verdict(lo, hi, r) {
    lo = num(lo); hi = num(hi);
    if (hi !== null && hi < 1) return "better";
    if (lo !== null && lo > 1) return "worse";
    return lo === null && hi === null && num(r) === null ? "none" : "unclear";
  }

  function prediction(cell) {
    const p = cell.prediction;
    if (p && typeof p === "object") {
      return [num(p.ratio ?? p.mid), num(p.ratio_low ?? p.low), num(p.ratio_high ?? p.high)];
    }
    return [num(p), null, null];
  }

  // What a predicted cell's tooltip says: where the figure and its band come from, or why there is none.
  function predictionTitle(cell) {
    const p = cell.prediction && typeof cell.prediction === "object" ? cell.prediction : {};
    if (num(p.ratio) === null) return `advise's prediction: none (${p.reason || "not priced"})`;
    const tables = (p.tables || []).join(", ") || "a latency table";
    const notes = (p.notes || []).length ? `; ${p.notes.join("; ")}` : "";
    return `advise's prediction from ${tables}, never measured on this traffic; band: advise's (interpolants, ` +
      `the table's spread, the bucket reading, kv pools)${notes}`;
  }

  // The cell's top-k: its own field, else the "topk2048" in its shape ("448+64 h16 topk2048 bfloat16/bfloat16").
  function topkOf(c) {
    if (c.topk !== null && c.topk !== undefined) return String(c.topk);
    const m = /\btopk(\d+)\b/.exec(c.shape || "");
    return m ? m[1] : "any";
  }
  const restOfShape = (c) => (c.shape || "").replace(/\s*\btopk\d+\b/, "").trim();
  const cellId = (c) => `${c.model}|${c.rows_bucket}|${c.shape || topkOf(c)}|${c.call_class || ""}`;
  const looseId = (c) => `${c.model}|${c.rows_bucket}`;
  const bucketLow = (label) => { const n = parseInt(label, 10); return isNaN(n) ? Infinity : n; };

  // Per model, shape (but its top-k) and call class: the rows buckets and top-k columns of its cells, by (rows, topk).
  function grids(cells) {
    const out = new Map();
    for (const c of cells || []) {
      const key = `${c.model}|${restOfShape(c)}|${c.call_class || ""}`;
      if (!out.has(key)) out.set(key, { model: c.model, shape: restOfShape(c), callClass: c.call_class || null, rows: [], topk: [], cells: new Map() });
      const g = out.get(key);
      if (!g.rows.includes(c.rows_bucket)) g.rows.push(c.rows_bucket);
      if (!g.topk.includes(topkOf(c))) g.topk.push(topkOf(c));
      g.cells.set(`${c.rows_bucket}|${topkOf(c)}`, c);
    }
    for (const g of out.values()) {
      g.rows.sort((a, b) => bucketLow(a) - bucketLow(b));
      g.topk.sort((a, b) => (a === "any") - (b === "any") || parseInt(a, 10) - parseInt(b, 10));
    }
    return [...out.keys()].sort().map((k) => out.get(k));
  }

  function table(g, which) {
    const measured = which === "measured";
    const head = el("tr", {}, el("th", { text: "rows" }), ...g.topk.map((k) => el("th", { text: k === "any" ? "any top-k" : `top-k ${k}` })));
    const body = g.rows.map((rows) => el("tr", {}, el("th", { text: rows }), ...g.topk.map((k) => {
      const c = g.cells.get(`${rows}|${k}`);
      if (!c) return el("td", { class: "none", text: "" });
      const [r, lo, hi] = measured ? [c.ratio, c.ratio_low, c.ratio_high] : prediction(c);
      const title = measured
        ? `${c.kernel_b} / ${c.kernel_a}: ${c.calls_b} B calls (${c.timed_b} timed), ${c.calls_a} A calls (${c.timed_a} timed)`
        : predictionTitle(c);
      const cls = measured ? verdict(lo, hi, r) : `predicted ${verdict(lo, hi, r)}`;
      return el("td", { class: cls, "data-rows": rows, "data-topk": k, "data-ratio": num(r),
                        "data-low": num(lo), "data-high": num(hi), title, text: band(r, lo, hi) });
    })));
    const caption = measured ? "measured B/A [95% band]" : "predicted B/A [advise's band] (from a latency table)";
    return el("table", { class: `exp-${which}`, "data-model": g.model, "data-call-class": g.callClass },
      el("caption", { text: caption }), el("thead", {}, head), el("tbody", {}, ...body));
  }

  // Each cell's points over time: [{ts, ratio, low, high}] from history points [{t, cells: [...]}], keyed by the
  // cell's full id where the history names its shape and call class, else by model and rows bucket.
  function series(points) {
    const out = new Map();
    for (const p of points || []) {
      const ts = num(p.t ?? p.ts);
      if (ts === null) continue;
      for (const c of p.cells || []) {
        const id = c.shape !== undefined || c.call_class !== undefined ? cellId(c) : looseId(c);
        if (!out.has(id)) out.set(id, { cell: c, points: [] });
        out.get(id).points.push({ ts, ratio: num(c.ratio), low: num(c.ratio_low), high: num(c.ratio_high) });
      }
    }
    for (const s of out.values()) s.points.sort((a, b) => a.ts - b.ts);
    return out;
  }

  // One cell's ratio (line) and band (shaded) over time, with 1.0 (no difference) and the harm bound dashed.
  function chart(s, harm) {
    const W = 300, H = 130, L = 36, R = 8, T = 18, B = 20;
    const pts = s.points.filter((p) => p.ratio !== null);
    const c = s.cell;
    const root = svg("svg", { class: "exp-chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img",
                              "data-cell": cellId(c), "data-points": pts.length });
    const name = [`rows ${c.rows_bucket}`, topkOf(c) === "any" ? null : `top-k ${topkOf(c)}`].filter((v) => v).join(" · ");
    root.append(svg("title", {}, `B/A over time: ${[c.model, name, c.shape, c.call_class].filter((v) => v).join(", ")}`));
    root.append(svg("text", { x: L, y: 12, "font-size": 11 }, name));
    if (!pts.length) {
      root.append(svg("text", { x: L, y: H / 2, "font-size": 11, fill: "#71717a" }, "no ratio yet"));
      return root;
    }
    const vals = [1, ...(harm ? [1 + harm] : [])];
    for (const p of pts) vals.push(p.ratio, ...(p.low !== null ? [p.low] : []), ...(p.high !== null ? [p.high] : []));
    let lo = Math.max(0, Math.min(...vals)), hi = Math.min(Math.max(...vals), 10);
    if (hi - lo < 0.05) { lo -= 0.025; hi += 0.025; }
    const t0 = pts[0].ts, t1 = pts[pts.length - 1].ts;
    const x = (t) => L + (t1 > t0 ? ((t - t0) / (t1 - t0)) * (W - L - R) : (W - L - R) / 2);
    const y = (v) => T + (1 - (Math.min(Math.max(v, lo), hi) - lo) / (hi - lo)) * (H - T - B);
    const banded = pts.filter((p) => p.low !== null && p.high !== null);
    if (banded.length === 1) {
      const p = banded[0];
      root.append(svg("line", { class: "band", x1: x(p.ts), x2: x(p.ts), y1: y(p.low), y2: y(p.high), stroke: "#93c5fd", "stroke-width": 6 }));
    } else if (banded.length) {
      const upper = banded.map((p) => `${x(p.ts).toFixed(1)},${y(p.high).toFixed(1)}`);
      const lower = banded.slice().reverse().map((p) => `${x(p.ts).toFixed(1)},${y(p.low).toFixed(1)}`);
      root.append(svg("polygon", { class: "band", points: [...upper, ...lower].join(" "), fill: "#bfdbfe", "fill-opacity": 0.7 }));
    }
    root.append(svg("line", { class: "parity", x1: L, x2: W - R, y1: y(1), y2: y(1), stroke: "#52525b", "stroke-dasharray": "3 3" }));
    if (harm) {
      root.append(svg("line", { class: "harm", x1: L, x2: W - R, y1: y(1 + harm), y2: y(1 + harm), stroke: "#dc2626", "stroke-dasharray": "4 2" }));
    }
    const line = pts.map((p) => `${x(p.ts).toFixed(1)},${y(p.ratio).toFixed(1)}`).join(" ");
    root.append(svg(pts.length > 1 ? "polyline" : "circle", pts.length > 1
      ? { class: "ratio", "data-series": `ratio|${cellId(c)}`, points: line, fill: "none", stroke: "#1d4ed8", "stroke-width": 1.5 }
      : { class: "ratio", cx: x(pts[0].ts), cy: y(pts[0].ratio), r: 2.5, fill: "#1d4ed8" }));
    const ticks = [lo, hi, ...(Math.min(Math.abs(y(1) - y(lo)), Math.abs(y(1) - y(hi))) > 10 ? [1] : [])];
    for (const v of ticks) root.append(svg("text", { x: L - 4, y: y(v) + 3, "font-size": 9, "text-anchor": "end" }, v.toFixed(2)));
    const span = t1 - t0;
    root.append(svg("text", { x: W - R, y: H - 5, "font-size": 9, "text-anchor": "end" },
      span > 0 ? `last ${span >= 120 ? (span / 60).toFixed(0) + " min" : span.toFixed(0) + " s"}` : "one flush"));
    return root;
  }

  function stateBadge(e) {
    const byPerson = e.stop_reason === "user";  // stopped by CLI or HTTP; any other reason is the kill switch
    const acked = e.state === "stopped" && e.acknowledged && typeof e.acknowledged === "object";
    const cls = e.state === "stopped" && !byPerson && !acked ? "self-stop" : e.state;  // red until acknowledged
    let text = e.state === "stopped" ? `stopped: ${e.stop_reason || "no reason given"}` : e.state;
    if (acked) text += `, acknowledged${e.acknowledged.by ? " by " + e.acknowledged.by : ""}`;
    else if (e.state === "stopped" && !byPerson) text += ` (alerting until: routescope experiment ack ${e.id})`;
    return el("span", { class: `badge ${cls}`, "data-state": e.state, "data-acknowledged": acked ? "1" : null, text });
  }

  function savingText(e) {
    const s = e.saving || {};
    const mid = num(s.seconds);
    if (mid === null) return "saving: not measured yet (too few timed calls)";
    const lo = num(s.low), hi = num(s.high);
    const f = (v) => (v * 1e3).toFixed(3);
    const b = lo !== null && hi !== null ? ` [${f(lo)}, ${f(hi)}]` : "";
    return `saving over the observed traffic: ${f(mid)} ms of kernel time${b} (negative: B costs)`;
  }

  function pointsOf(e, history) {
    if (history && !Array.isArray(history) && Array.isArray(history[e.id])) return history[e.id];
    if (Array.isArray(history)) return history.filter((p) => (p.id ?? p.experiment) === e.id);
    return Array.isArray(e.history) ? e.history : [];
  }

  function experiment(e, history) {
    const harm = num(e.harm_bound ?? (e.config || {}).harm_bound);
    const box = el("div", { class: "exp", "data-experiment": e.id, "data-state": e.state });
    box.append(el("h3", {}, `${e.id}: candidate ${e.candidate} on ${(100 * (num(e.fraction) || 0)).toFixed(1)}% of eligible calls`, stateBadge(e)));
    box.append(el("p", { class: "note saving", text: savingText(e) }));
    const never = Object.entries(e.never_moved || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    box.append(el("p", { class: "note never-moved", text: `calls never moved to B: ${never || "none"}` }));
    if (e.crossover !== undefined && e.crossover !== null) {
      const x = typeof e.crossover === "object" ? e.crossover.rows : e.crossover;
      const rule = typeof e.crossover === "object" && e.crossover.rule ? ` (${e.crossover.rule})` : "";
      box.append(el("p", { class: "note crossover", "data-rows": x ?? null,
                           text: x === null || x === undefined ? "measured crossover: not shown by the bands yet"
                                                               : `measured crossover: ${x} rows${rule}` }));
    }
    const gs = grids(e.cells);
    if (!gs.length) box.append(el("p", { class: "note", text: "no eligible call yet" }));
    const byCell = series(pointsOf(e, history));
    const loose = new Map();
    for (const c of e.cells || []) loose.set(looseId(c), (loose.get(looseId(c)) || 0) + 1);
    for (const g of gs) {
      const where = [g.model, g.shape, g.callClass].filter((v) => v).join(" · ");
      box.append(el("h4", { class: "where", text: where }));
      box.append(el("div", { class: "pair" }, table(g, "measured"), table(g, "predicted")));
      const charts = el("div", { class: "charts" });
      let waiting = 0;
      for (const rows of g.rows) for (const k of g.topk) {
        const c = g.cells.get(`${rows}|${k}`);
        if (!c) continue;
        const found = byCell.get(cellId(c)) || (loose.get(looseId(c)) === 1 ? byCell.get(looseId(c)) : undefined);
        const now = num(c.ratio) === null ? [] : [{ ts: 0, ratio: num(c.ratio), low: num(c.ratio_low), high: num(c.ratio_high) }];
        const points = found ? found.points : now;
        if (!points.some((p) => p.ratio !== null)) { waiting += 1; continue; }  // nothing to draw yet
        charts.append(chart({ cell: c, points }, harm));
      }
      box.append(charts);
      if (waiting) box.append(el("p", { class: "note waiting", "data-cells": waiting,
        text: `${waiting} cell${waiting > 1 ? "s" : ""} with no ratio yet (both arms need a timed call); charted once they have one` }));
    }
    return box;
  }

  function render(container, experiments, history) {
    if (!container) return;
    if (!document.getElementById(STYLE_ID)) document.head.append(el("style", { id: STYLE_ID, text: CSS }));
    const list = Array.isArray(experiments) ? experiments : [];
    container.replaceChildren(el("h2", {}, "Experiments ", el("span", { class: "hint",
      text: "measured on this traffic: B time / A time, anytime-valid 95% bands" })));
    if (!list.length) {
      container.append(el("p", { class: "note empty", text: "No experiment. Start one: routescope experiment start CANDIDATE (or serve --demo --experiment aa)." }));
      return;
    }
    for (const e of list) container.append(experiment(e, history));
  }

  window.routescopeExperiments = { render, band, verdict, grids };
})();
