// The dashboard's placement maps: which member owns each shard of every
// entity type and each unit of every worker group, coloured by owner; and
// this node's job workers (its job services' slots).

import { $, el, list, makeRow, ownerColour, reconcile, setAttr, setText, toggleEmpty } from "./dom.js";
import { DASH, fmtDuration, fmtInt, num } from "./format.js";

// ---------------------------------------------------------------- shard map

export function renderShards(o) {
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

// The worker groups' units as Redis places them: one row each, by group
// then unit (the overview carries the first 500 and the total).
export function renderWorkers(o) {
  const workers = list(o.workers);
  const members = new Map(list(o.members).map((m) => [String(m.id), m]));
  const now = num(o.time_ms);
  reconcile($("workers-body"), workers, (w) => `${w.group}\u0000${w.unit}`,
    () => {
      const tr = makeRow(5, [3, 4]);
      tr.setAttribute("data-testid", "worker-row");
      tr.cells[0].className = "mono";
      tr.cells[1].className = "mono";
      const owner = el("span", { class: "chip" });
      owner.append(el("span", { class: "swatch", "aria-hidden": "true" }), el("span"));
      tr.cells[2].append(owner);
      return tr;
    },
    (tr, w) => {
      const group = w.group == null ? DASH : String(w.group);
      const unit = w.unit == null ? DASH : String(w.unit);
      const owner = w.owner == null ? "" : String(w.owner);
      const from = w.handing_off_from == null ? "" : String(w.handing_off_from);
      const m = members.get(owner);
      const ownerDown = m !== undefined && m.alive === false;
      const since = num(w.since);
      const age = now !== null && since !== null ? Math.max(0, now - since) / 1000 : null;
      setAttr(tr, "data-group", group);
      setAttr(tr, "data-unit", unit);
      setAttr(tr, "data-owner", owner);
      setAttr(tr, "data-epoch", num(w.epoch) === null ? "" : num(w.epoch));
      tr.classList.toggle("is-owner-down", ownerDown);
      setText(tr.cells[0], group);
      setText(tr.cells[1], unit);
      const chip = tr.cells[2].firstChild;
      chip.firstChild.style.background = ownerColour(owner || null);
      setText(chip.lastChild, `${owner || "unassigned"}${from ? ` (from ${from})` : ""}${ownerDown ? " · down" : ""}`);
      setAttr(chip, "title", from ? `handed off from ${from}: starts once ${from} has stopped it` : owner);
      setText(tr.cells[3], fmtInt(w.epoch));
      setText(tr.cells[4], age === null ? DASH : fmtDuration(age));
    });
  const total = num(o.workers_total) ?? workers.length;
  const groups = new Set(workers.map((w) => String(w.group))).size;
  let summary = "";
  if (total > 0) {
    summary = `${fmtInt(total)} unit${total === 1 ? "" : "s"}`;
    summary += total > workers.length ? `, first ${fmtInt(workers.length)} shown` : ` in ${groups} group${groups === 1 ? "" : "s"}`;
  }
  setText($("workers-summary"), summary);
  const error = o.workers_error == null ? "" : String(o.workers_error);
  setText($("workers-error"), error ? `Not current: the last read from Redis failed (${error}).` : "");
  $("workers-error").hidden = error === "";
  setText($("workers-empty"), o.mode === "single"
    ? "No worker units: this node runs alone (no cluster, no Redis)."
    : "No worker units: no worker group has units in Redis.");
  toggleEmpty("workers-empty", workers.length === 0 && error === "");
}

// ---------------------------------------------------------------- job workers

// This node's job services' worker slots: FSMs, not placed units.
export function renderJobWorkers(o) {
  const slots = list(o.job_workers);
  reconcile($("job-workers-body"), slots, (w) => `${w.service}\u0000${w.slot}`,
    () => {
      const tr = makeRow(4);
      tr.setAttribute("data-testid", "job-worker-row");
      tr.cells[0].className = "mono";
      tr.cells[1].className = "mono";
      return tr;
    },
    (tr, w) => {
      const state = w.state == null ? DASH : String(w.state);
      setAttr(tr, "data-service", w.service == null ? "" : String(w.service));
      setAttr(tr, "data-state", state);
      setText(tr.cells[0], w.service == null ? DASH : String(w.service));
      setText(tr.cells[1], w.slot == null ? DASH : String(w.slot));
      setText(tr.cells[2], state);
      setText(tr.cells[3], w.owner == null ? DASH : String(w.owner));
      tr.classList.toggle("is-busy", state === "running");
    });
  const running = slots.filter((w) => w.state === "running").length;
  setText($("job-workers-summary"), slots.length ? `${running} of ${slots.length} running` : "");
  toggleEmpty("job-workers-empty", slots.length === 0);
}
