// The troupe node dashboard: polls GET api/overview once a second and draws
// it; two actions (POST rebalance, GET entities/{type}/{id}).
//
// Plain JavaScript with no dependencies, because the node serves these files
// from its own binary and must work on a machine with no route to a CDN.
// doc/dashboard.md maps every panel to the API fields it shows.
//
// Every number in the overview may be absent or null (a node reports what it
// has); such values show as "—". Data always goes into the page through
// textContent, never innerHTML, since entity ids and counter names come from
// applications.
"use strict";

(() => {
  const POLL_INTERVAL_MS = 1000;
  // A node that takes longer than this to answer is reported as unreachable
  // rather than leaving the page silently frozen on old data.
  const POLL_TIMEOUT_MS = 3000;
  // Charts show at least this much time, so the first few samples do not
  // stretch across the whole width and suggest a trend that is not there.
  const MIN_CHART_WINDOW_MS = 30000;
  const DASH = "—";

  const $ = (id) => document.getElementById(id);

  // Errors the page itself hit, for the browser test to report.
  const state = { errors: [], lastOk: 0, failures: 0, overview: null };
  window.troupeDashboard = state;
  window.addEventListener("error", (e) => state.errors.push(String(e.message)));

  // ---------------------------------------------------------------- formatting

  // A finite number, or null for anything else (absent, null, a string).
  function num(v) {
    return typeof v === "number" && Number.isFinite(v) ? v : null;
  }

  const intFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const decFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

  function fmtInt(v) {
    v = num(v);
    return v === null ? DASH : intFormat.format(v);
  }

  // Rates and latencies: one decimal below 100, none above (noise otherwise).
  function fmtNum(v) {
    v = num(v);
    if (v === null) return DASH;
    return Math.abs(v) < 100 ? decFormat.format(v) : intFormat.format(v);
  }

  // Axis labels: short, so they fit beside a 150-pixel-high chart.
  function fmtCompact(v) {
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

  function fmtDuration(seconds) {
    seconds = num(seconds);
    if (seconds === null) return DASH;
    const s = Math.floor(seconds);
    const pad = (n) => String(n).padStart(2, "0");
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} m ${pad(s % 60)} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${pad(Math.floor(s / 60) % 60)} m`;
    return `${Math.floor(s / 86400)} d ${pad(Math.floor(s / 3600) % 24)} h`;
  }

  function fmtClock(ms) {
    ms = num(ms);
    if (ms === null) return DASH;
    const d = new Date(ms);
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function words(key) {
    return String(key).replace(/_/g, " ");
  }

  // ---------------------------------------------------------------- DOM helpers

  // Writes only when the text changed: the page refreshes every second and
  // rewriting identical text would drop the user's text selection.
  function setText(el, text) {
    text = String(text);
    if (el.textContent !== text) el.textContent = text;
  }

  function setAttr(el, name, value) {
    value = String(value);
    if (el.getAttribute(name) !== value) el.setAttribute(name, value);
  }

  function el(tag, attrs = {}, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Makes parent's children match items, reusing the element made for the
  // same key on the previous refresh. Rebuilding everything each second would
  // close hover titles, lose focus and make the browser test's element
  // handles go stale; reusing keeps all three.
  function reconcile(parent, items, keyOf, create, update) {
    const existing = new Map();
    for (const child of Array.from(parent.children)) {
      if (child.dataset.key !== undefined) existing.set(child.dataset.key, child);
      else child.remove();
    }
    const seen = new Map();
    let prev = null;
    for (const item of items) {
      // Duplicate keys (a malformed report) still get one element each.
      let key = String(keyOf(item));
      const n = seen.get(key) || 0;
      seen.set(key, n + 1);
      if (n > 0) key += "#" + n;
      let child = existing.get(key);
      if (child) existing.delete(key);
      else {
        child = create(item);
        child.dataset.key = key;
      }
      update(child, item);
      const wanted = prev ? prev.nextElementSibling : parent.firstElementChild;
      if (wanted !== child) parent.insertBefore(child, wanted);
      prev = child;
    }
    for (const child of existing.values()) child.remove();
  }

  // A table row with `n` cells; `numeric` lists the right-aligned columns.
  function makeRow(n, numeric = []) {
    const tr = el("tr");
    for (let i = 0; i < n; i++) tr.append(el("td", numeric.includes(i) ? { class: "num" } : {}));
    return tr;
  }

  function toggleEmpty(id, isEmpty) {
    $(id).hidden = !isEmpty;
  }

  function list(v) {
    return Array.isArray(v) ? v.filter((x) => x && typeof x === "object") : [];
  }

  function dict(v) {
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  }

  // ---------------------------------------------------------------- owner colours

  // Owners keep the colour they were first given for the life of the page,
  // so a rebalance shows as cells changing colour, not as the legend
  // reshuffling. The first ten come from a palette chosen to stay distinct
  // on light and dark backgrounds.
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759",
                   "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#8cd17d"];
  const ownerColours = new Map();

  function ownerColour(owner) {
    if (owner === null || owner === undefined || owner === "") return "var(--unowned)";
    owner = String(owner);
    if (!ownerColours.has(owner)) {
      const i = ownerColours.size;
      let colour = PALETTE[i % PALETTE.length];
      if (i >= PALETTE.length) {
        // Past the palette: spread hues by the golden angle.
        colour = `hsl(${Math.round((i * 137.5) % 360)} 55% 55%)`;
      }
      ownerColours.set(owner, colour);
    }
    return ownerColours.get(owner);
  }

  // ---------------------------------------------------------------- header

  function renderHeader(o) {
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
  function renderHealth(o) {
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

  function renderCounters(o) {
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

  function renderMembers(o) {
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
                     el("span", { class: "tag tag-self" }, "self"));
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

  function renderTypes(o) {
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

  // ---------------------------------------------------------------- shard map

  function renderShards(o) {
    const shards = list(o.shards);
    const members = new Map(list(o.members).map((m) => [String(m.id), m]));

    // Group by type, in the order types first appear, shards in number order.
    const byType = new Map();
    for (const s of shards) {
      const type = s.type == null ? DASH : String(s.type);
      if (!byType.has(type)) byType.set(type, []);
      byType.get(type).push(s);
    }
    for (const cells of byType.values()) cells.sort((a, b) => (num(a.shard) ?? 0) - (num(b.shard) ?? 0));

    reconcile($("shard-map"), [...byType.entries()], ([type]) => type,
      ([type]) => {
        const row = el("div", { class: "shard-type", "data-testid": "shard-type", "data-type": type });
        const label = el("div", { class: "shard-type-label" });
        label.append(el("span", { class: "mono" }, type), el("span", { class: "summary" }));
        row.append(label, el("div", { class: "shard-cells", role: "list" }));
        return row;
      },
      (row, [, cells]) => {
        setText(row.querySelector(".summary"), `${cells.length} shard${cells.length === 1 ? "" : "s"}`);
        const grid = row.querySelector(".shard-cells");
        // Numbers inside the cells while they fit; plain squares for big maps.
        grid.classList.toggle("dense", cells.length > 64);
        reconcile(grid, cells, (s) => s.shard,
          () => el("span", { class: "shard-cell", role: "listitem", "data-testid": "shard-cell" }),
          (cell, s) => {
            const owner = s.owner == null || s.owner === "" ? "" : String(s.owner);
            const m = members.get(owner);
            const ownerDown = m !== undefined && m.alive === false;
            setAttr(cell, "data-owner", owner);
            setAttr(cell, "data-type", s.type == null ? "" : String(s.type));
            setAttr(cell, "data-shard", num(s.shard) === null ? "" : num(s.shard));
            cell.style.background = ownerColour(owner || null);
            cell.classList.toggle("is-unowned", owner === "");
            cell.classList.toggle("is-owner-down", ownerDown);
            setText(cell, num(s.shard) === null ? "" : num(s.shard));
            const title = `${s.type ?? DASH} shard ${fmtInt(s.shard)}\nowner: ${owner || "unassigned"}` +
              `${ownerDown ? " (down)" : ""}\nepoch: ${fmtInt(s.epoch)}`;
            setAttr(cell, "title", title);
            setAttr(cell, "aria-label", title.replace(/\n/g, ", "));
          });
      });

    // Legend: every owner on the map plus every member (a member owning
    // nothing is worth seeing too), with how many shards each holds.
    const counts = new Map();
    for (const s of shards) {
      const owner = s.owner == null || s.owner === "" ? "" : String(s.owner);
      counts.set(owner, (counts.get(owner) || 0) + 1);
    }
    const owners = [...new Set([...members.keys(), ...counts.keys()])]
      .filter((id) => id !== "" || counts.has(""))
      .sort((a, b) => (a === "") - (b === "") || a.localeCompare(b));
    reconcile($("shard-legend"), shards.length ? owners : [], (id) => id,
      () => {
        const item = el("span", { class: "legend-item", "data-testid": "legend-item" });
        item.append(el("span", { class: "swatch", "aria-hidden": "true" }), el("span"));
        return item;
      },
      (item, id) => {
        const m = members.get(id);
        setAttr(item, "data-owner", id);
        item.firstChild.style.background = ownerColour(id || null);
        const n = counts.get(id) || 0;
        const down = m !== undefined && m.alive === false ? " · down" : "";
        setText(item.lastChild, `${id || "unassigned"} · ${n}${down}`);
        item.classList.toggle("is-dead", down !== "");
      });
    setText($("shards-summary"), shards.length ? `${shards.length} shards over ${byType.size} type${byType.size === 1 ? "" : "s"}` : "");
    toggleEmpty("shards-empty", shards.length === 0);
  }

  // ---------------------------------------------------------------- worker map

  function renderWorkers(o) {
    const workers = list(o.workers);
    const groups = new Map();
    for (const w of workers) {
      const g = w.group == null ? DASH : String(w.group);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(w);
    }
    reconcile($("workers-body"), [...groups.entries()], ([g]) => g,
      () => {
        const tr = makeRow(2);
        tr.setAttribute("data-testid", "worker-group-row");
        tr.cells[0].className = "mono";
        tr.cells[1].append(el("div", { class: "chips" }));
        return tr;
      },
      (tr, [g, units]) => {
        setAttr(tr, "data-group", g);
        setText(tr.cells[0], g);
        reconcile(tr.cells[1].firstChild, units, (w) => w.unit,
          () => {
            const chip = el("span", { class: "chip", "data-testid": "worker-cell" });
            chip.append(el("span", { class: "swatch", "aria-hidden": "true" }), el("span"));
            return chip;
          },
          (chip, w) => {
            const owner = w.owner == null ? "" : String(w.owner);
            const unit = w.unit == null ? DASH : String(w.unit);
            setAttr(chip, "data-group", g);
            setAttr(chip, "data-unit", unit);
            setAttr(chip, "data-owner", owner);
            setAttr(chip, "title", `${g} / ${unit}\nowner: ${owner || "unassigned"}`);
            chip.firstChild.style.background = ownerColour(owner || null);
            setText(chip.lastChild, `${unit} · ${owner || "unassigned"}`);
          });
      });
    setText($("workers-summary"), workers.length ? `${workers.length} unit${workers.length === 1 ? "" : "s"}` : "");
    toggleEmpty("workers-empty", workers.length === 0);
  }

  // ---------------------------------------------------------------- processing

  function renderProcessing(o) {
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

  function renderPatterns(o) {
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

  function renderCharts(o) {
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

  // ---------------------------------------------------------------- polling

  function render(o) {
    // Members get their colours in id order before any panel asks, so the
    // colours do not depend on which shard or worker is listed first.
    for (const id of list(o.members).map((m) => String(m.id)).sort()) ownerColour(id);
    // Each panel renders on its own, so one malformed field costs one
    // panel, not the page.
    for (const f of [renderHeader, renderHealth, renderCounters, renderCharts, renderMembers, renderTypes,
                     renderShards, renderWorkers, renderProcessing, renderPatterns]) {
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
      const resp = await fetch(url, { cache: "no-store", ...options, signal: abort.signal });
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
      setText(status, `Rebalance (${at}): ${r.body !== null ? JSON.stringify(r.body) : r.text || "done"}`);
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
})();
