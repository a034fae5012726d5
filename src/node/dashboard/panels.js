// The dashboard's panels: header, health banner, counters, members, entity
// types, processing entities, patterns and projections, each drawn from the
// overview.

import { $, dict, el, list, makeRow, ownerColour, reconcile, setAttr, setText, toggleEmpty } from "./dom.js";
import { DASH, fmtClock, fmtDuration, fmtInt, fmtNum, intFormat, num, words } from "./format.js";

// ---------------------------------------------------------------- header

export function renderHeader(o) {
  const node = o.node == null ? DASH : String(o.node);
  setText($("node-id"), node);
  document.title = `troupe · ${node}`;
  const mode = o.mode == null ? DASH : String(o.mode);
  setText($("mode-badge"), mode);
  setAttr($("mode-badge"), "data-mode", mode);

  // A failing service outranks every other state: it is what needs a
  // person, whether or not the node is ready or draining.
  const failing = failingServices(o);
  let status = "not-ready";
  let label = "not ready";
  if (isUnhealthy(o)) { status = "unhealthy"; label = "unhealthy"; }
  else if (o.draining === true) { status = "draining"; label = "draining"; }
  else if (o.ready === true) { status = "ready"; label = "ready"; }
  else if (o.ready == null) { status = "unknown"; label = "ready " + DASH; }
  setText($("state-badge"), label);
  setAttr($("state-badge"), "data-state", status);
  setAttr($("state-badge"), "title", failing.length ? `failing: ${failing.map(([name]) => name).join(", ")}` : "");

  setText($("uptime"), fmtDuration(o.uptime_s));
  setText($("version"), o.version == null ? DASH : String(o.version));
}

// ---------------------------------------------------------------- health

// The services the overview reports down ({"up": false}), by name.
function failingServices(o) {
  return Object.entries(dict(dict(o.health).services))
    .filter(([, v]) => v && typeof v === "object" && v.up === false)
    .sort(([a], [b]) => a.localeCompare(b));
}

function isUnhealthy(o) {
  return dict(o.health).status === "unhealthy" || failingServices(o).length > 0;
}

// The red banner under the header: one line per failing service, with
// the code and message the node reports, and nothing when it reports none.
export function renderHealth(o) {
  const failing = failingServices(o);
  $("banner-unhealthy").hidden = !isUnhealthy(o);
  setText($("unhealthy-title"),
    failing.length === 0 ? "Unhealthy (the node names no failing service)."
      : failing.length === 1 ? "Unhealthy: 1 service is failing."
      : `Unhealthy: ${failing.length} services are failing.`);
  reconcile($("unhealthy-services"), failing, ([name]) => name,
    () => {
      const li = el("li", { "data-testid": "unhealthy-service" });
      li.append(el("span", { class: "service" }), el("span", { class: "code" }), el("span", { class: "message" }));
      return li;
    },
    (li, [name, v]) => {
      const code = v.code == null ? "" : String(v.code);
      setAttr(li, "data-service", name);
      setAttr(li, "data-code", code);
      setText(li.querySelector(".service"), name);
      setText(li.querySelector(".code"), code || DASH);
      setText(li.querySelector(".message"), v.message == null ? DASH : String(v.message));
    });
}

// ---------------------------------------------------------------- counters

// Counters whose name says something went wrong are tinted when non-zero,
// so failures stand out among the tiles without a per-name configuration.
const BAD_COUNTER = /fail|error|timed out|timeout|refus|reject|dead|lost/i;

export function renderCounters(o) {
  const entries = Object.entries(dict(o.counters));
  reconcile($("counters"), entries, ([k]) => k,
    ([k]) => {
      const li = el("li", { class: "tile", "data-testid": "counter-tile", "data-name": k });
      li.append(el("span", { class: "tile-value" }), el("span", { class: "tile-name" }, k));
      return li;
    },
    (li, [k, v]) => {
      setText(li.firstChild, fmtInt(v));
      const bad = BAD_COUNTER.test(k) && num(v) > 0;
      li.classList.toggle("is-bad", bad);
      setAttr(li, "data-value", num(v) === null ? "" : num(v));
    });
  toggleEmpty("counters-empty", entries.length === 0);
}

// ---------------------------------------------------------------- members

export function renderMembers(o) {
  const members = list(o.members);
  const alive = members.filter((m) => m.alive !== false).length;
  setText($("members-summary"), members.length ? `${alive} of ${members.length} alive` : "");
  // The largest value of each load column, for the in-cell bars.
  const maxOf = (f) => Math.max(0, ...members.map((m) => num(m[f]) ?? 0));
  const max = { shards: maxOf("shards"), entities_active: maxOf("entities_active"),
                mailbox_depth: maxOf("mailbox_depth"), messages_per_s: maxOf("messages_per_s") };

  reconcile($("members-body"), members, (m) => m.id,
    () => {
      const tr = makeRow(7, [3, 4, 5, 6]);
      tr.setAttribute("data-testid", "member-row");
      const first = tr.cells[0];
      first.append(el("span", { class: "swatch", "aria-hidden": "true" }), el("span", { class: "member-id" }),
                   el("span", { class: "tag tag-self" }, "self"),
                   el("span", { class: "tag tag-version", "data-testid": "member-version", title: "app version" }));
      tr.cells[2].append(el("span", { class: "tag" }));
      for (const i of [3, 4, 5, 6]) {
        tr.cells[i].append(el("span", { class: "cell-bar", "aria-hidden": "true" }), el("span", { class: "cell-value" }));
      }
      return tr;
    },
    (tr, m) => {
      const id = m.id == null ? DASH : String(m.id);
      setAttr(tr, "data-node-id", id);
      setAttr(tr, "data-alive", m.alive !== false);
      setAttr(tr, "data-self", m.self === true);
      tr.classList.toggle("is-dead", m.alive === false);
      tr.classList.toggle("is-self", m.self === true);

      const [cNode, cAddr, cStatus] = tr.cells;
      cNode.querySelector(".swatch").style.background = ownerColour(m.id);
      // Another member's id links to its own dashboard; only http(s), so a
      // reported address can never become a javascript: link.
      const idEl = cNode.querySelector(".member-id");
      const admin = typeof m.admin === "string" && /^https?:\/\//.test(m.admin) ? m.admin : null;
      if (admin && m.self !== true) {
        if (!idEl.firstChild || idEl.firstChild.tagName !== "A") idEl.replaceChildren(el("a"));
        setAttr(idEl.firstChild, "href", admin);
        setAttr(idEl.firstChild, "title", `open ${id}'s dashboard (${admin})`);
        setText(idEl.firstChild, id);
      } else {
        setText(idEl, id);
      }
      cNode.querySelector(".tag-self").hidden = m.self !== true;
      const version = cNode.querySelector(".tag-version");
      setText(version, typeof m.app_version === "string" ? m.app_version : "");
      version.hidden = !(typeof m.app_version === "string" && m.app_version !== "");
      setText(cAddr, m.address == null ? DASH : String(m.address));

      const tag = cStatus.firstChild;
      let status = "alive";
      if (m.alive === false) status = "down";
      else if (m.draining === true) status = "draining";
      else if (m.alive == null) status = DASH;
      setText(tag, status);
      tag.className = `tag tag-${status === DASH ? "unknown" : status}`;

      // Bars compare members with each other, so there are none for one.
      tr.classList.toggle("no-bars", members.length < 2);
      const cols = [["shards", fmtInt], ["entities_active", fmtInt], ["mailbox_depth", fmtInt], ["messages_per_s", fmtNum]];
      cols.forEach(([field, fmt], i) => {
        const cell = tr.cells[3 + i];
        const v = num(m[field]);
        setText(cell.querySelector(".cell-value"), fmt(v));
        const share = v === null || max[field] === 0 ? 0 : v / max[field];
        cell.querySelector(".cell-bar").style.width = `${Math.round(share * 100)}%`;
      });
      // A deep mailbox is the first sign of a member that cannot keep up.
      const depth = num(m.mailbox_depth) ?? 0;
      tr.cells[5].classList.toggle("is-warn", depth >= 100 && depth < 1000);
      tr.cells[5].classList.toggle("is-bad", depth >= 1000);
    });
  toggleEmpty("members-empty", members.length === 0);
}

// ---------------------------------------------------------------- entity types

export function renderTypes(o) {
  const types = list(o.entity_types);
  reconcile($("types-body"), types, (t) => t.type,
    () => {
      const tr = makeRow(6, [1, 2, 3, 4, 5]);
      tr.setAttribute("data-testid", "entity-type-row");
      tr.cells[0].append(el("span", { class: "mono" }));
      return tr;
    },
    (tr, t) => {
      const name = t.type == null ? DASH : String(t.type);
      setAttr(tr, "data-type", name);
      setText(tr.cells[0].firstChild, name);
      setText(tr.cells[1], fmtInt(t.active));
      setText(tr.cells[2], fmtInt(t.processing));
      setText(tr.cells[3], fmtInt(t.passivations));
      setText(tr.cells[4], fmtInt(t.shards_hosted));
      setText(tr.cells[5], fmtInt(t.events_persisted));
    });
  toggleEmpty("types-empty", types.length === 0);

  // Offer the known types in the lookup form.
  reconcile($("entity-type-names"), types.filter((t) => t.type != null), (t) => t.type,
    (t) => el("option", { value: String(t.type) }), () => {});
}

// ---------------------------------------------------------------- processing

export function renderProcessing(o) {
  const rows = list(o.processing).slice().sort((a, b) => (num(b.age_ms) ?? -1) - (num(a.age_ms) ?? -1));
  // Deadlines are compared with the node's clock, not the browser's, so
  // a skewed laptop clock cannot make everything look overdue.
  const now = num(o.time_ms) ?? Date.now();
  reconcile($("processing-body"), rows, (p) => `${p.type}\u0000${p.id}`,
    () => {
      const tr = makeRow(6, [2]);
      tr.setAttribute("data-testid", "processing-row");
      tr.cells[1].className = "mono";
      tr.cells[3].className = "bar-col";
      tr.cells[3].append(el("span", { class: "age-bar" }, ""));
      tr.cells[3].firstChild.append(el("span"));
      return tr;
    },
    (tr, p) => {
      const age = num(p.age_ms);
      const since = num(p.since_ms);
      const deadline = num(p.deadline_ms);
      setAttr(tr, "data-type", p.type == null ? "" : String(p.type));
      setAttr(tr, "data-id", p.id == null ? "" : String(p.id));
      setText(tr.cells[0], p.type == null ? DASH : String(p.type));
      setText(tr.cells[1], p.id == null ? DASH : String(p.id));
      setText(tr.cells[2], fmtInt(age));
      setText(tr.cells[4], fmtClock(since));

      let deadlineText = DASH;
      let overdue = false;
      if (deadline !== null) {
        const left = deadline - now;
        overdue = left < 0;
        deadlineText = `${fmtClock(deadline)} (${overdue ? "overdue by" : "in"} ${intFormat.format(Math.abs(left))} ms)`;
      }
      setText(tr.cells[5], deadlineText);
      tr.classList.toggle("is-overdue", overdue);

      // The bar is how much of its time budget the entity has used.
      let used = 0;
      if (age !== null && since !== null && deadline !== null && deadline > since) {
        used = Math.min(1, age / (deadline - since));
      }
      const bar = tr.cells[3].firstChild;
      bar.firstChild.style.width = `${Math.round(used * 100)}%`;
      bar.classList.toggle("is-warn", used >= 0.75 && !overdue);
      bar.classList.toggle("is-bad", overdue);
      setAttr(bar, "title", deadline === null ? "no deadline" : `${Math.round(used * 100)}% of the time to its deadline`);
    });
  setText($("processing-summary"), rows.length ? `${rows.length} in flight` : "");
  toggleEmpty("processing-empty", rows.length === 0);
}

// ---------------------------------------------------------------- patterns

// Known patterns first, in the order the design documents them; anything
// else the node reports follows, so a new pattern shows up without a
// dashboard change.
const PATTERN_ORDER = ["locks", "process_manager", "jobs"];
const PATTERN_TITLES = { locks: "keyed locks", process_manager: "process manager", jobs: "job service" };

export function renderPatterns(o) {
  const entries = Object.entries(dict(o.patterns)).filter(([, v]) => v && typeof v === "object")
    .sort(([a], [b]) => {
      const ia = PATTERN_ORDER.indexOf(a), ib = PATTERN_ORDER.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
    });
  reconcile($("patterns"), entries, ([k]) => k,
    ([k]) => {
      const card = el("div", { class: "pattern", "data-testid": "pattern-group", "data-pattern": k });
      card.append(el("h3", {}, PATTERN_TITLES[k] || words(k)), el("dl", { class: "kv" }), el("div", { class: "pattern-tables" }));
      return card;
    },
    (card, [, fields]) => {
      const scalars = Object.entries(fields).filter(([, v]) => !Array.isArray(v) && (v === null || typeof v !== "object"));
      reconcile(card.querySelector("dl"), scalars, ([k]) => k,
        ([k]) => {
          const d = el("div", { "data-field": k });
          d.append(el("dt", {}, words(k)), el("dd"));
          return d;
        },
        (d, [k, v]) => {
          setText(d.lastChild, typeof v === "string" || typeof v === "boolean" ? String(v) : fmtInt(v));
          // Same rule as the counter tiles: a non-zero failure count stands out.
          d.classList.toggle("is-bad", BAD_COUNTER.test(words(k)) && num(v) > 0);
        });
      // Lists of records (jobs.queued_by_priority) become small tables.
      const arrays = Object.entries(fields).filter(([, v]) => Array.isArray(v));
      reconcile(card.querySelector(".pattern-tables"), arrays, ([k]) => k,
        ([k]) => {
          const t = el("table", { class: "mini", "data-field": k });
          t.append(el("caption", {}, words(k)), el("thead"), el("tbody"));
          return t;
        },
        (t, [, rows]) => {
          rows = list(rows);
          const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
          const head = el("tr");
          for (const c of cols) head.append(el("th", { scope: "col", class: "num" }, words(c)));
          if (t.tHead.textContent !== head.textContent) t.tHead.replaceChildren(head);
          const body = t.tBodies[0];
          reconcile(body, rows, (r) => cols.map((c) => r[c]).join("\u0000"),
            () => makeRow(cols.length, cols.map((_, i) => i)),
            (tr, r) => cols.forEach((c, i) => tr.cells[i] && setText(tr.cells[i], fmtInt(r[c]))));
          t.hidden = rows.length === 0 && cols.length === 0;
        });
    });
  toggleEmpty("patterns-empty", entries.length === 0);
}

// ---------------------------------------------------------------- projections

// Lag from this many milliseconds on is amber, and red from the second.
const LAG_WARN_MS = 1000;
const LAG_BAD_MS = 10000;

// One row per projection (name and source: a slice is a source), with what
// its status reports: a failed one says where it stopped.
export function renderProjections(o) {
  const rows = list(o.projections);
  reconcile($("projections-body"), rows, (p) => String(p.key),
    () => {
      const tr = makeRow(9, [3, 4, 5, 6]);
      tr.setAttribute("data-testid", "projection-row");
      tr.cells[0].className = "mono";
      tr.cells[1].className = "mono";
      tr.cells[2].append(el("span", { class: "tag" }));
      tr.cells[3].classList.add("lag");
      tr.cells[7].className = "mono";
      return tr;
    },
    (tr, p) => {
      const state = p.state == null ? DASH : String(p.state);
      setAttr(tr, "data-key", p.key == null ? "" : String(p.key));
      setAttr(tr, "data-state", state);
      setText(tr.cells[0], p.name == null ? DASH : String(p.name));
      setText(tr.cells[1], p.source == null ? DASH : String(p.source));
      const tag = tr.cells[2].firstChild;
      setText(tag, state);
      tag.className = `tag tag-${state === DASH ? "unknown" : state}`;
      const lag = num(p.lag_ms);
      setText(tr.cells[3], fmtInt(lag));
      setAttr(tr.cells[3], "data-value", lag === null ? "" : lag);
      tr.cells[3].classList.toggle("is-warn", lag !== null && lag >= LAG_WARN_MS && lag < LAG_BAD_MS);
      tr.cells[3].classList.toggle("is-bad", lag !== null && lag >= LAG_BAD_MS);
      setText(tr.cells[4], fmtInt(p.events_applied));
      setText(tr.cells[5], fmtInt(p.retries));
      setText(tr.cells[6], fmtInt(p.conflicts));
      setText(tr.cells[7], p.offset == null ? DASH : String(p.offset));
      const f = p.failure && typeof p.failure === "object" ? p.failure : null;
      setText(tr.cells[8], f ? `${f.persistence_id} seq ${fmtInt(f.seq)} (offset ${f.offset}): ${f.code}: ${f.message}`
                             : "");
      tr.classList.toggle("is-overdue", state === "failed");
    });
  const failed = rows.filter((p) => p.state === "failed").length;
  setText($("projections-summary"), rows.length ? `${rows.length}${failed ? `, ${failed} failed` : ""}` : "");
  toggleEmpty("projections-empty", rows.length === 0);
}
