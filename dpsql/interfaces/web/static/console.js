// The console's helpers: requests carrying the login's CSRF token, tables and charts written
// with textContent and SVG elements only (a data value is never read as markup).
"use strict";
const dpsql = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

  async function call(method, url, body) {
    const options = { method, headers: { "X-CSRF-Token": csrf() }, credentials: "same-origin" };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(url, options);
    let data = null;
    try { data = await response.json(); } catch (e) { data = { error: "Error", message: "no answer" }; }
    if (response.status === 401) {
      window.location.assign("/login"); // the login ended (idle, expired, logged out)
    }
    if (!response.ok) {
      const error = new Error(data.message || "refused");
      error.kind = data.error || "Error";
      throw error;
    }
    return data;
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows.map((cells) => {
      const tr = el("tr");
      cells.forEach((c) => tr.appendChild(c instanceof Node ? c : el("td", c)));
      return tr;
    }));
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"];

  function frame(target, xmax, ymax) {
    const w = Number(target.getAttribute("width")), h = Number(target.getAttribute("height"));
    const m = { l: 56, r: 180, t: 14, b: 34 };
    const x = (v) => m.l + (xmax > 0 ? v / xmax : 0) * (w - m.l - m.r);
    const y = (v) => h - m.b - (ymax > 0 ? v / ymax : 0) * (h - m.t - m.b);
    target.replaceChildren();
    target.appendChild(svg("line", { x1: m.l, y1: h - m.b, x2: w - m.r, y2: h - m.b, stroke: "#444" }));
    target.appendChild(svg("line", { x1: m.l, y1: m.t, x2: m.l, y2: h - m.b, stroke: "#444" }));
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      target.appendChild(svg("text", { x: 4, y: y(v) + 4 }, Number(v.toPrecision(3))));
      const u = xmax >= 8 ? Math.round((xmax * i) / 4) : Number(((xmax * i) / 4).toPrecision(2));
      target.appendChild(svg("text", { x: x(u) - 8, y: h - m.b + 16 }, u));
    }
    return { x, y, w, h, m };
  }

  // Lines: series [{name, label, xs, ys}], a horizontal cap, axis titles.
  function lines(target, series, cap, capLabel, xTitle) {
    const xmax = Math.max(1, ...series.flatMap((s) => s.xs));
    const finite = series.flatMap((s) => s.ys.filter((v) => v !== null && isFinite(v)));
    const ymax = Math.max(cap || 0, ...finite, 1e-9) * 1.08;
    const f = frame(target, xmax, ymax);
    series.forEach((s, i) => {
      const points = s.xs.map((xv, j) => [xv, s.ys[j]]).filter((p) => p[1] !== null);
      const d = points.map((p, j) => (j ? "L" : "M") + f.x(p[0]).toFixed(1) + " " + f.y(p[1]).toFixed(1)).join(" ");
      const path = svg("path", { d, fill: "none", stroke: COLOURS[i % COLOURS.length], "stroke-width": 2 });
      path.dataset.curve = s.name;
      target.appendChild(path);
      target.appendChild(svg("text", { x: f.w - f.m.r + 8, y: f.m.t + 14 * i + 8, fill: COLOURS[i % COLOURS.length] }, s.name));
    });
    if (cap) {
      target.appendChild(svg("line", { x1: f.m.l, x2: f.w - f.m.r, y1: f.y(cap), y2: f.y(cap), stroke: "#000", "stroke-dasharray": "6 4" }));
      target.appendChild(svg("text", { x: f.m.l + 6, y: f.y(cap) - 4 }, capLabel || "cap"));
    }
    target.appendChild(svg("text", { x: f.m.l, y: f.h - 4 }, xTitle || "queries"));
  }

  // Bars with error bars: labels, values, and per bar a half-width, a quantile's [lo, hi]
  // interval, or null (none).
  function bars(target, labels, values, accuracy) {
    const ends = values.map((v, i) => {
      const a = accuracy[i];
      if (Array.isArray(a)) return [a[0], a[1]];
      return typeof a === "number" ? [v - a, v + a] : null;
    });
    const top = Math.max(...values.map((v, i) => Math.max(v, ends[i] ? ends[i][1] : v)), 1e-9) * 1.1;
    const lowest = Math.min(0, ...values.map((v, i) => Math.min(v, ends[i] ? ends[i][0] : v)));
    const w = Number(target.getAttribute("width")), h = Number(target.getAttribute("height"));
    const m = { l: 56, r: 10, t: 10, b: 40 };
    const span = top - lowest;
    const y = (v) => h - m.b - ((v - lowest) / span) * (h - m.t - m.b);
    const step = (w - m.l - m.r) / Math.max(1, values.length);
    target.replaceChildren();
    target.appendChild(svg("line", { x1: m.l, y1: y(0), x2: w - m.r, y2: y(0), stroke: "#444" }));
    for (let i = 0; i <= 4; i++) {
      const v = lowest + (span * i) / 4;
      target.appendChild(svg("text", { x: 2, y: y(v) + 4 }, Number(v.toPrecision(3))));
    }
    values.forEach((v, i) => {
      const x0 = m.l + i * step + step * 0.15, bw = step * 0.7;
      const bar = svg("rect", { x: x0, width: bw, y: Math.min(y(v), y(0)), height: Math.abs(y(v) - y(0)), fill: "#7fa7d9" });
      bar.dataset.value = v;
      target.appendChild(bar);
      if (ends[i]) {
        const cx = x0 + bw / 2, [lo, hi] = ends[i];
        const err = svg("line", { x1: cx, x2: cx, y1: y(lo), y2: y(hi), stroke: "#111", "stroke-width": 1.5 });
        err.dataset.errorBar = lo + " " + hi;
        target.appendChild(err);
        target.appendChild(svg("line", { x1: cx - 5, x2: cx + 5, y1: y(hi), y2: y(hi), stroke: "#111" }));
        target.appendChild(svg("line", { x1: cx - 5, x2: cx + 5, y1: y(lo), y2: y(lo), stroke: "#111" }));
      }
      target.appendChild(svg("text", { x: x0, y: h - m.b + 14 }, String(labels[i]).slice(0, 16)));
    });
  }

  return { call, el, fill, lines, bars };
})();
