// The dashboard's placement maps: which member owns each shard of every
// entity type, and the job services' worker slots, coloured by owner.

import { $, el, list, makeRow, ownerColour, reconcile, setAttr, setText, toggleEmpty } from "./dom.js";
import { DASH, fmtInt, num } from "./format.js";

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

export function renderWorkers(o) {
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
