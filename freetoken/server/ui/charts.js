// Inline-SVG charts for the status page. Every label is set through textContent (never
// innerHTML), so server strings cannot inject markup.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function svgText(x, y, text, anchor) {
  const node = svgEl("text", { x, y, "text-anchor": anchor || "start" });
  node.textContent = text;
  return node;
}

function clear(svg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  const a = Math.abs(v);
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 0.1) return v.toFixed(2);
  return v.toPrecision(2);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? String(v) : v.toFixed(2)) + " " + units[i];
}

// points: [{x: request seq, y: value or null}], drawn left to right; null values are skipped.
function lineChart(svg, points, color) {
  clear(svg);
  const W = 300, H = 130, L = 36, R = 8, T = 8, B = 18;
  const pts = points.filter((p) => p.y !== null && p.y !== undefined);
  svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d8dde6" }));
  if (pts.length === 0) {
    svg.appendChild(svgText(W / 2, H / 2, "no finished requests yet", "middle"));
    return;
  }
  const ymax = Math.max(...pts.map((p) => p.y)) * 1.1 || 1;
  const xmin = pts[0].x, xmax = pts[pts.length - 1].x;
  const sx = (x) => L + (xmax === xmin ? (W - L - R) / 2 : ((x - xmin) / (xmax - xmin)) * (W - L - R));
  const sy = (y) => H - B - (y / ymax) * (H - T - B);
  svg.appendChild(svgText(L - 4, T + 8, fmt(ymax), "end"));
  svg.appendChild(svgText(L - 4, H - B, "0", "end"));
  svg.appendChild(svgText(L, H - 6, "#" + xmin));
  svg.appendChild(svgText(W - R, H - 6, "#" + xmax, "end"));
  const coords = pts.map((p) => sx(p.x).toFixed(1) + "," + sy(p.y).toFixed(1)).join(" ");
  svg.appendChild(svgEl("polyline", { points: coords, fill: "none", stroke: color, "stroke-width": 1.5 }));
  for (const p of pts) svg.appendChild(svgEl("circle", { cx: sx(p.x), cy: sy(p.y), r: 2, fill: color }));
}

// layers: [{layer, hit_rate, fills, cpu_experts}] -> per layer a hit-rate bar and, under it,
// the split of misses between cache fills and the CPU.
function layerChart(svg, layers) {
  clear(svg);
  const W = 420, H = 120, L = 32, T = 8, B = 28;
  if (!layers.length) {
    svg.appendChild(svgText(W / 2, H / 2, "no expert cache", "middle"));
    return;
  }
  const slot = (W - L) / layers.length, bw = Math.max(2, slot * 0.7), h = H - T - B;
  svg.appendChild(svgText(L - 4, T + 8, "100%", "end"));
  svg.appendChild(svgText(L - 4, H - B, "0", "end"));
  layers.forEach((s, i) => {
    const x = L + i * slot + (slot - bw) / 2;
    const rate = s.hit_rate === null ? 0 : s.hit_rate;
    svg.appendChild(svgEl("rect", { x, y: T, width: bw, height: h, fill: "#eef1f6" }));
    svg.appendChild(svgEl("rect", { x, y: T + h * (1 - rate), width: bw, height: h * rate, fill: "#2563eb" }));
    const misses = s.fills + s.cpu_experts;
    const fillW = misses ? (bw * s.fills) / misses : 0;
    svg.appendChild(svgEl("rect", { x, y: H - B + 4, width: fillW, height: 6, fill: "#10b981" }));
    svg.appendChild(svgEl("rect", { x: x + fillW, y: H - B + 4, width: misses ? bw - fillW : 0, height: 6, fill: "#f59e0b" }));
    if (layers.length <= 24 || i % 4 === 0) svg.appendChild(svgText(x + bw / 2, H - 6, String(s.layer), "middle"));
  });
}

// parts: [{label, bytes, color}] -> one stacked bar of their shares, and a legend in `legend`.
function memoryBar(svg, parts, legend) {
  while (legend.firstChild) legend.removeChild(legend.firstChild);
  for (const p of parts) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = p.color;
    item.appendChild(swatch);
    item.appendChild(document.createTextNode(p.label + " " + fmtBytes(p.bytes)));
    legend.appendChild(item);
  }
  clear(svg);
  const W = 420, total = parts.reduce((a, p) => a + (p.bytes || 0), 0);
  if (!total) {
    svg.appendChild(svgText(W / 2, 20, "no cache memory reported", "middle"));
    return;
  }
  let x = 0;
  for (const p of parts) {
    const w = (W * (p.bytes || 0)) / total;
    if (w <= 0) continue;
    const rect = svgEl("rect", { x, y: 4, width: w, height: 28, fill: p.color });
    const title = svgEl("title");
    title.textContent = p.label + ": " + fmtBytes(p.bytes);
    rect.appendChild(title);
    svg.appendChild(rect);
    x += w;
  }
}
