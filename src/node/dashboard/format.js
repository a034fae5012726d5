// The dashboard's number and time formatting. Every value may be absent or
// null (a node reports what it has); such values format as DASH.

export const DASH = "—";

// A finite number, or null for anything else (absent, null, a string).
export function num(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

export const intFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const decFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

export function fmtInt(v) {
  v = num(v);
  return v === null ? DASH : intFormat.format(v);
}

// Rates and latencies: one decimal below 100, none above (noise otherwise).
export function fmtNum(v) {
  v = num(v);
  if (v === null) return DASH;
  return Math.abs(v) < 100 ? decFormat.format(v) : intFormat.format(v);
}

// Axis labels: short, so they fit beside a 150-pixel-high chart.
export function fmtCompact(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return trimZero((v / 1e9).toFixed(1)) + "G";
  if (a >= 1e6) return trimZero((v / 1e6).toFixed(1)) + "M";
  if (a >= 1e3) return trimZero((v / 1e3).toFixed(1)) + "k";
  if (a >= 10 || a === 0) return String(Math.round(v));
  return trimZero(v.toFixed(2));
}

function trimZero(s) {
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

export function fmtDuration(seconds) {
  seconds = num(seconds);
  if (seconds === null) return DASH;
  const s = Math.floor(seconds);
  const pad = (n) => String(n).padStart(2, "0");
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} m ${pad(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${pad(Math.floor(s / 60) % 60)} m`;
  return `${Math.floor(s / 86400)} d ${pad(Math.floor(s / 3600) % 24)} h`;
}

export function fmtClock(ms) {
  ms = num(ms);
  if (ms === null) return DASH;
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function words(key) {
  return String(key).replace(/_/g, " ");
}
