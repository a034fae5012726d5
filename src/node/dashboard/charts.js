// The dashboard's charts: the overview's sampled series (rates and latency
// quantiles) drawn on canvases, redrawn when the layout or colour scheme
// changes.

import { $, dict, el, reconcile, setAttr, setText } from "./dom.js";
import { DASH, fmtCompact, fmtNum, num, words } from "./format.js";

// Charts show at least this much time, so the first few samples do not
// stretch across the whole width and suggest a trend that is not there.
const MIN_CHART_WINDOW_MS = 30000;

// ---------------------------------------------------------------- charts

// Known rate names first, with their own colours and units; other names
// the node adds get a chart of their own after these.
const RATE_ORDER = ["messages", "events", "payments"];
const LINE_COLOURS = ["--line-1", "--line-2", "--line-3", "--line-4", "--line-5"];
const charts = new Map();  // name → chart record

function makeChart(name, title, unit) {
  const fig = el("figure", { class: "chart", "data-chart": name });
  const cap = el("figcaption");
  const titleEl = el("span", { class: "chart-title" }, title);
  const latest = el("span", { class: "chart-latest", "data-testid": "chart-latest" }, DASH);
  cap.append(titleEl, latest);
  const canvas = el("canvas", {
    "data-testid": "chart", "data-chart": name, "data-points": "0", role: "img", "aria-label": title,
  });
  fig.append(cap, canvas);
  const chart = { name, title, unit, fig, canvas, latest, lines: [], t: [], intervalMs: 1000 };
  charts.set(name, chart);
  return chart;
}

export function renderCharts(o) {
  const series = dict(o.series);
  const intervalMs = (num(series.interval_s) ?? 1) * 1000;
  const t = Array.isArray(series.t_ms) ? series.t_ms.map(num) : [];
  const rates = dict(series.rates);
  const latency = dict(series.latency_ms);

  const names = Object.keys(rates).filter((k) => Array.isArray(rates[k]))
    .sort((a, b) => {
      const ia = RATE_ORDER.indexOf(a), ib = RATE_ORDER.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
    });
  const specs = names.map((k, i) => ({
    name: `rate:${k}`, title: `${words(k)} / s`, unit: "per second",
    lines: [{ label: `${words(k)}/s`, colour: LINE_COLOURS[Math.min(i, LINE_COLOURS.length - 1)], values: rates[k] }],
    suffix: "/s",
  }));
  // The latency chart is always there: p50 and p99 are the first thing
  // to look at when something is slow, even before the node reports them.
  specs.push({
    name: "latency", title: "latency", unit: "milliseconds",
    lines: [
      { label: "p50", colour: "--line-1", values: Array.isArray(latency.p50) ? latency.p50 : [] },
      { label: "p99", colour: "--line-bad", values: Array.isArray(latency.p99) ? latency.p99 : [] },
    ],
    suffix: " ms",
  });

  reconcile($("charts"), specs, (s) => s.name,
    (s) => makeChart(s.name, s.title, s.unit).fig,
    (fig, s) => {
      const chart = charts.get(s.name);
      chart.lines = s.lines.map((l) => ({ ...l, values: l.values.map(num) }));
      chart.t = t;
      chart.intervalMs = intervalMs;
      chart.suffix = s.suffix;
      // The latest value of each line, unit once at the end ("p50 1.8 · p99 16 ms").
      const parts = chart.lines.map((l) => {
        const v = fmtNum(lastValue(l.values));
        return chart.lines.length > 1 ? `${l.label} ${v}` : v;
      });
      setText(chart.latest, parts.join(" · ") + s.suffix);
      setAttr(chart.canvas, "aria-label", `${s.title}, latest: ${parts.join(", ")}${s.suffix}`);
      drawChart(chart);
    });
  for (const name of [...charts.keys()]) {
    if (!specs.some((s) => s.name === name)) charts.delete(name);
  }
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}

// Round steps (1, 2, 2.5, 5 × 10^n) so the axis reads 0, 250, 500, …
function niceStep(range, ticks) {
  const raw = range / ticks;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
}

function drawChart(chart) {
  const { canvas } = chart;
  const css = getComputedStyle(document.documentElement);
  const colour = (v) => css.getPropertyValue(v).trim() || "#888";
  const cssW = canvas.clientWidth, cssH = canvas.clientHeight;
  if (cssW === 0 || cssH === 0) return;
  // Draw at the device's pixel density so lines and text stay sharp.
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(cssW * dpr) || canvas.height !== Math.round(cssH * dpr)) {
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, cssW, cssH);

  // Sample times: the node's, or if it sent none, one interval apart
  // ending now.
  const n = Math.max(0, ...chart.lines.map((l) => l.values.length));
  const times = [];
  for (let i = 0; i < n; i++) {
    const fromNode = chart.t.length === n ? chart.t[i] : null;
    times.push(fromNode ?? (i - (n - 1)) * chart.intervalMs);
  }
  const end = n ? times[n - 1] : 0;
  const span = n > 1 ? end - times[0] : 0;
  const windowMs = Math.max(MIN_CHART_WINDOW_MS, span);

  let max = 0;
  for (const l of chart.lines) for (const v of l.values) if (v !== null && v > max) max = v;
  const step = niceStep(max > 0 ? max : 1, 4);
  const top = Math.max(step, Math.ceil((max > 0 ? max : 1) / step) * step);

  const font = css.getPropertyValue("--chart-font").trim() || "11px sans-serif";
  g.font = font;
  // Left margin fits the widest y label.
  let labelW = 0;
  for (let v = 0; v <= top + step / 2; v += step) labelW = Math.max(labelW, g.measureText(fmtCompact(v)).width);
  const pad = { l: Math.ceil(labelW) + 10, r: 8, t: 22, b: 18 };
  const w = cssW - pad.l - pad.r, h = cssH - pad.t - pad.b;
  const x = (tm) => pad.l + w - ((end - tm) / windowMs) * w;
  const y = (v) => pad.t + h - (v / top) * h;

  // Grid and y labels.
  g.strokeStyle = colour("--grid");
  g.fillStyle = colour("--muted");
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (let v = 0; v <= top + step / 2; v += step) {
    const yy = Math.round(y(v)) + 0.5;
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(pad.l + w, yy); g.stroke();
    g.fillText(fmtCompact(v), pad.l - 6, yy);
  }
  // Unit over the y axis.
  g.textAlign = "left";
  g.textBaseline = "alphabetic";
  g.fillText(chart.unit, 2, 10);

  // X labels: seconds before the newest sample, on round steps.
  const xStep = [5, 10, 15, 30, 60, 120, 300, 600].find((s) => windowMs / 1000 / s <= 5) ?? 600;
  g.textBaseline = "top";
  for (let s = 0; s * 1000 <= windowMs; s += xStep) {
    const xx = x(end - s * 1000);
    // A label that would run into the y labels is left out.
    if (s > 0 && xx - g.measureText(`−${s}s`).width / 2 < pad.l - 2) continue;
    g.textAlign = s === 0 ? "right" : "center";
    g.fillText(s === 0 ? "now" : `−${s}s`, xx, pad.t + h + 4);
    if (s > 0) {
      g.beginPath(); g.moveTo(Math.round(xx) + 0.5, pad.t + h); g.lineTo(Math.round(xx) + 0.5, pad.t + h + 3); g.stroke();
    }
  }
  // Axis baseline, darker than the grid.
  g.strokeStyle = colour("--axis");
  g.beginPath(); g.moveTo(pad.l, Math.round(y(0)) + 0.5); g.lineTo(pad.l + w, Math.round(y(0)) + 0.5); g.stroke();

  // Lines; a null value breaks the line instead of pretending it was zero.
  let values = 0;
  for (const l of chart.lines) {
    const c = colour(l.colour);
    const pts = [];
    const offset = n - l.values.length;  // shorter arrays align to the newest end
    l.values.forEach((v, i) => pts.push(v === null ? null : [x(times[i + offset]), y(v)]));
    values += pts.filter(Boolean).length;
    // A soft fill under a chart's only line makes its shape readable at a glance.
    if (chart.lines.length === 1) {
      g.fillStyle = c;
      g.globalAlpha = 0.12;
      forEachRun(pts, (run) => {
        if (run.length < 2) return;
        g.beginPath();
        g.moveTo(run[0][0], y(0));
        for (const [px, py] of run) g.lineTo(px, py);
        g.lineTo(run[run.length - 1][0], y(0));
        g.closePath();
        g.fill();
      });
      g.globalAlpha = 1;
    }
    g.strokeStyle = c;
    g.lineWidth = 1.75;
    g.lineJoin = "round";
    forEachRun(pts, (run) => {
      g.beginPath();
      run.forEach(([px, py], i) => (i ? g.lineTo(px, py) : g.moveTo(px, py)));
      if (run.length === 1) { g.arc(run[0][0], run[0][1], 1.5, 0, 2 * Math.PI); g.fillStyle = c; g.fill(); }
      else g.stroke();
    });
    // Mark the newest point, the value the caption shows.
    const lastPt = [...pts].reverse().find(Boolean);
    if (lastPt) {
      g.fillStyle = c;
      g.beginPath(); g.arc(lastPt[0], lastPt[1], 2.5, 0, 2 * Math.PI); g.fill();
    }
  }
  // Legend for charts with more than one line, top right inside the plot.
  if (chart.lines.length > 1) {
    g.textAlign = "right";
    g.textBaseline = "alphabetic";
    let lx = pad.l + w;
    for (const l of [...chart.lines].reverse()) {
      g.fillStyle = colour("--muted");
      g.fillText(l.label, lx, 10);
      lx -= g.measureText(l.label).width + 4;
      g.fillStyle = colour(l.colour);
      g.fillRect(lx - 10, 5, 10, 3);
      lx -= 20;
    }
  }
  // What the browser test reads: samples on the x axis, and how many of
  // them carried a value.
  setAttr(canvas, "data-points", n);
  setAttr(canvas, "data-values", values);
}

// Calls fn with each stretch of consecutive non-null points.
function forEachRun(pts, fn) {
  let run = [];
  for (const p of pts) {
    if (p) run.push(p);
    else if (run.length) { fn(run); run = []; }
  }
  if (run.length) fn(run);
}

// Canvases have a fixed pixel size; redraw when the layout changes theirs.
const resizeObserver = new ResizeObserver(() => charts.forEach(drawChart));
resizeObserver.observe($("charts"));
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => charts.forEach(drawChart));
