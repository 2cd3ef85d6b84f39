// The page's pictures of time and latency, drawn as inline SVG (no library, no network):
// window.routescopeCharts.rates(container, history, nowTs) and .latency(container, latencyRows, models).
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function div(cls, text) {
    const node = document.createElement("div");
    node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmtRate(v) {
    if (v >= 100) return v.toFixed(0);
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function fmtTime(s) {
    if (s < 1e-3) return (s * 1e6).toFixed(s < 1e-5 ? 1 : 0) + " µs";
    if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 2 : 1) + " ms";
    return s.toFixed(2) + " s";
  }

  // Calls/s (blue) and decode-in-prefill calls/s (red), each interval drawn as a step at its rate.
  function rates(container, history, nowTs) {
    const list = (history && history.rates) || [];
    const W = 640, H = 150, L = 44, R = 8, T = 10, B = 22;
    const now = Math.max(nowTs || 0, ...list.map((r) => r.ts));
    const kept = (history && history.span_s) || 600;  // what the service keeps; the axis spans what there is (>= 1 min)
    const first = list.length ? list[0].ts - list[0].dt_s : now;
    const span = Math.min(kept, Math.max(60, now - first));
    const x = (ts) => L + (W - L - R) * Math.max(0, Math.min(1, 1 - (now - ts) / span));
    const top = Math.max(1e-9, ...list.map((r) => r.calls_per_s)) * 1.1;
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "rates-svg", role: "img",
      "aria-label": "calls per second over the last minutes", "data-intervals": list.length });
    chart.append(svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), class: "axis" }));
    chart.append(svg("line", { x1: L, y1: T, x2: L, y2: y(0), class: "axis" }));
    chart.append(svg("text", { x: L - 4, y: T + 8, class: "tick end" }, fmtRate(top / 1.1)));
    chart.append(svg("text", { x: L - 4, y: y(0), class: "tick end" }, "0"));
    chart.append(svg("text", { x: L, y: H - 6, class: "tick" }, span >= 120 ? `−${Math.round(span / 60)} min` : `−${Math.round(span)} s`));
    chart.append(svg("text", { x: W - R, y: H - 6, class: "tick end" }, "now"));
    for (const [key, cls] of [["calls_per_s", "calls"], ["decode_in_prefill_per_s", "dip"]]) {
      const pts = [];
      for (const r of list) {
        if (now - r.ts > span) continue;
        pts.push(`${x(r.ts - r.dt_s).toFixed(1)},${y(r[key]).toFixed(1)}`, `${x(r.ts).toFixed(1)},${y(r[key]).toFixed(1)}`);
      }
      if (pts.length) chart.append(svg("polyline", { points: pts.join(" "), class: `line ${cls}`, "data-series": cls }));
    }
    const last = list[list.length - 1];
    const legend = div("legend-line");
    legend.append(div("key calls", last ? `calls ${fmtRate(last.calls_per_s)}/s` : "calls"),
      div("key dip", last ? `decode-in-prefill ${fmtRate(last.decode_in_prefill_per_s)}/s` : "decode-in-prefill"));
    if (!list.length) legend.append(div("hint", "no rate yet: it needs two flushes read by /routing"));
    container.replaceChildren(chart, legend);
  }

  // One small histogram per kernel × rows bucket: bars on a log time axis shared by the model's series.
  function latency(container, rows, models, shortKernel) {
    const native = rows.filter((r) => r.native && r.native.buckets && r.native.buckets.length);
    const bounds = (r) => {
      const base = Math.pow(2, Math.pow(2, -r.native.schema));
      return r.native.buckets.map(([i, n]) => ({ lo: Math.pow(base, i - 1), hi: Math.pow(base, i), n }));
    };
    const out = [];
    for (const model of models) {
      const mine = native.filter((r) => r.model === model);
      if (!mine.length) continue;
      const all = mine.flatMap(bounds);
      const lo = Math.log(Math.min(...all.map((b) => b.lo))), hi = Math.log(Math.max(...all.map((b) => b.hi)));
      const span = Math.max(hi - lo, 1e-9);
      const group = div("latency-model");
      group.append(div("latency-title", model));
      const grid = div("latency-grid");
      const sorted = mine.slice().sort((a, b) => a.kernel.localeCompare(b.kernel) || parseInt(a.rows_bucket, 10) - parseInt(b.rows_bucket, 10));
      for (const r of sorted) {
        const bars = bounds(r);
        const W = 200, H = 54, top = Math.max(...bars.map((b) => b.n));
        const x = (v) => 2 + (W - 4) * (Math.log(v) - lo) / span;
        const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 12}`, class: "hist", role: "img",
          "aria-label": `${r.kernel} ${r.rows_bucket} rows latency`, "data-series": `${r.model}|${r.kernel}|${r.rows_bucket}`,
          "data-counted": r.native.zero + bars.reduce((a, b) => a + b.n, 0), "data-samples": r.samples, "data-bars": bars.length });
        for (const b of bars) {
          const h = Math.max(1, (H - 2) * b.n / top);
          chart.append(svg("rect", { x: x(b.lo).toFixed(2), y: (H - h).toFixed(2), width: Math.max(0.8, x(b.hi) - x(b.lo)).toFixed(2),
            height: h.toFixed(2), class: "bar" }));
        }
        for (const [q, cls] of [[r.p50_s, "p50"], [r.p99_s, "p99"]]) {
          if (q) chart.append(svg("line", { x1: x(q), x2: x(q), y1: 0, y2: H, class: `q ${cls}` }));
        }
        chart.append(svg("text", { x: 2, y: H + 11, class: "tick" }, fmtTime(Math.exp(lo))));
        chart.append(svg("text", { x: W - 2, y: H + 11, class: "tick end" }, fmtTime(Math.exp(hi))));
        const cell = div("hist-cell");
        const k = shortKernel ? shortKernel(r.kernel).name : r.kernel;
        cell.append(div("hist-label", `${k} · ${r.rows_bucket} rows`),
          div("hist-sub", `${r.samples} timed · p50 ${fmtTime(r.p50_s)} · p99 ${fmtTime(r.p99_s)}`), chart);
        grid.append(cell);
      }
      group.append(grid);
      out.push(group);
    }
    const classic = rows.filter((r) => r.samples && !(r.native && r.native.buckets && r.native.buckets.length)).length;
    if (classic) out.push(div("hint", `${classic} series have classic buckets only (their quantiles are in the matrices)`));
    if (!out.length) out.push(div("hint", "no timed call yet"));
    container.replaceChildren(...out);
  }

  window.routescopeCharts = { rates, latency };
})();
