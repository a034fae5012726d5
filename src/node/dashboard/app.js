// The troupe node dashboard: polls GET api/overview once a second and draws
// it; two actions (POST rebalance, GET entities/{type}/{id}); asks for the
// admin token when the node wants one.
//
// Plain JavaScript with no dependencies, because the node serves these files
// from its own binary and must work on a machine with no route to a CDN.
// doc/dashboard.md maps every panel to the API fields it shows.
//
// Every number in the overview may be absent or null (a node reports what it
// has); such values show as "—". Data always goes into the page through
// textContent, never innerHTML, since entity ids and counter names come from
// applications.
//
// ES modules, all served by the node: this one polls, acts and hands the
// overview to the panels (panels.js), the placement maps (maps.js) and the
// charts (charts.js), which share format.js and dom.js.

import { renderCharts } from "./charts.js";
import { $, list, ownerColour, setAttr, setText } from "./dom.js";
import { fmtClock, fmtDuration } from "./format.js";
import { renderJobWorkers, renderShards, renderWorkers } from "./maps.js";
import { renderCounters, renderHeader, renderHealth, renderMembers, renderPatterns, renderProcessing, renderProjections,
         renderTypes } from "./panels.js";

const POLL_INTERVAL_MS = 1000;
// A node that takes longer than this to answer is reported as unreachable
// rather than leaving the page silently frozen on old data.
const POLL_TIMEOUT_MS = 3000;

// Errors the page itself hit, for the browser test to report.
const state = { errors: [], lastOk: 0, failures: 0, overview: null };
window.troupeDashboard = state;
window.addEventListener("error", (e) => state.errors.push(String(e.message)));

// ---------------------------------------------------------------- admin token

// A node with an [admin] token_file answers 401 without its token: the page
// asks for it once (the form in index.html), keeps it in this tab's
// sessionStorage and sends it with every request; a refused one asks again.
const TOKEN_KEY = "troupe.adminToken";
let waitingForToken = false;

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function askForToken() {
  const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  setText($("token-detail"), refused ? "The node refused the token given: enter the current one."
                                     : "It is kept in this tab only.");
  $("token-form").hidden = false;
  if (!waitingForToken) $("token-input").focus();
  waitingForToken = true;
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token-input").value = "";
  $("token-form").hidden = true;
  if (waitingForToken) {
    waitingForToken = false;
    poll();
  }
});

// ---------------------------------------------------------------- polling

function render(o) {
  // Members get their colours in id order before any panel asks, so the
  // colours do not depend on which shard or worker is listed first.
  for (const id of list(o.members).map((m) => String(m.id)).sort()) ownerColour(id);
  // Each panel renders on its own, so one malformed field costs one
  // panel, not the page.
  for (const f of [renderHeader, renderHealth, renderCounters, renderCharts, renderMembers, renderTypes,
                   renderShards, renderWorkers, renderJobWorkers, renderProcessing, renderPatterns, renderProjections]) {
    try { f(o); } catch (e) {
      state.errors.push(`${f.name}: ${e && e.message}`);
      console.error(f.name, e);
    }
  }
}

async function fetchJson(url, options = {}, timeoutMs = POLL_TIMEOUT_MS) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    const headers = { ...authHeaders(), ...(options.headers || {}) };
    const resp = await fetch(url, { cache: "no-store", ...options, headers, signal: abort.signal });
    if (resp.status === 401) askForToken();
    const text = await resp.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { /* not JSON: report the text */ }
    return { ok: resp.ok, status: resp.status, body, text };
  } catch (e) {
    const why = e && e.name === "AbortError" ? `no answer within ${timeoutMs} ms` : (e && e.message) || String(e);
    return { ok: false, status: 0, body: null, text: why };
  } finally {
    clearTimeout(timer);
  }
}

// The message of an error answer: the API's {"error":{"code","message"}}
// when there is one, else the status and the start of the body.
function errorText(r) {
  const err = r.body && r.body.error;
  if (err && typeof err === "object") {
    return [err.code, err.message].filter((x) => x != null && x !== "").join(": ") || `HTTP ${r.status}`;
  }
  if (r.status === 0) return r.text;
  const snippet = (r.text || "").trim().slice(0, 200);
  return `HTTP ${r.status}${snippet ? ": " + snippet : ""}`;
}

async function poll() {
  const started = performance.now();
  const r = await fetchJson("api/overview");
  // Polling stops while the token form waits; submitting it polls again.
  if (r.status === 401) return;
  if (r.ok && r.body && typeof r.body === "object") {
    state.overview = r.body;
    state.lastOk = Date.now();
    state.failures = 0;
    render(r.body);
    setText($("updated"), fmtClock(state.lastOk).slice(0, 8));
    setUnreachable(null);
  } else {
    state.failures++;
    setUnreachable(r.ok ? "the answer was not a JSON object" : errorText(r));
  }
  // Fixed rate, not fixed delay, so a slow answer does not stretch the
  // charts' time axis; never more than one request in flight.
  setTimeout(poll, Math.max(0, POLL_INTERVAL_MS - (performance.now() - started)));
}

function setUnreachable(why) {
  const banner = $("banner-unreachable");
  document.body.classList.toggle("is-stale", why !== null);
  if (why === null) {
    banner.hidden = true;
    return;
  }
  const since = state.lastOk
    ? `Showing data from ${fmtDuration((Date.now() - state.lastOk) / 1000)} ago.`
    : "No data yet.";
  setText($("banner-detail"), `${why}. Retrying every second (${state.failures} failed). ${since}`);
  banner.hidden = false;
  setText($("state-badge"), "unreachable");
  setAttr($("state-badge"), "data-state", "unreachable");
}

// ---------------------------------------------------------------- actions

$("rebalance-button").addEventListener("click", async () => {
  const button = $("rebalance-button");
  const status = $("action-status");
  button.disabled = true;
  status.hidden = false;
  setAttr(status, "data-state", "pending");
  setText(status, "Rebalance: asking the node…");
  // Rebalancing moves shards, so it may take a while; allow for it.
  const r = await fetchJson("rebalance", { method: "POST" }, 30000);
  const at = fmtClock(Date.now()).slice(0, 8);
  if (r.ok) {
    setAttr(status, "data-state", "ok");
    // A rebalance that waits (two app versions live) says why in words.
    const waits = r.body !== null && r.body.outcome === "versions_mixed";
    const what = waits ? r.body.message : r.body !== null ? JSON.stringify(r.body) : r.text || "done";
    setText(status, `Rebalance (${at}): ${what}`);
  } else {
    setAttr(status, "data-state", "error");
    setText(status, `Rebalance failed (${at}): ${errorText(r)}`);
  }
  button.disabled = false;
});

$("lookup-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const type = $("lookup-type").value.trim();
  const id = $("lookup-id").value.trim();
  const result = $("lookup-result");
  if (!type || !id) return;
  // Each part encoded on its own: ids may contain '/', '?' or spaces.
  const path = `entities/${encodeURIComponent(type)}/${encodeURIComponent(id)}`;
  setText($("lookup-request"), `GET /${path} …`);
  setAttr(result, "data-state", "pending");
  const r = await fetchJson(path, {}, 10000);
  setText($("lookup-request"), `GET /${path} → ${r.status || "no answer"}`);
  result.hidden = false;
  if (r.ok) {
    setAttr(result, "data-state", "ok");
    setText(result, r.body !== null ? JSON.stringify(r.body, null, 2) : r.text);
  } else {
    setAttr(result, "data-state", "error");
    setText(result, errorText(r));
  }
});

poll();
