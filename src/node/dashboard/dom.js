// The dashboard's DOM helpers: writes that touch the page only when
// something changed, keyed reconciliation of lists, the owners' colours.
// Data goes into the page through textContent, never innerHTML.

export const $ = (id) => document.getElementById(id);

// Writes only when the text changed: the page refreshes every second and
// rewriting identical text would drop the user's text selection.
export function setText(el, text) {
  text = String(text);
  if (el.textContent !== text) el.textContent = text;
}

export function setAttr(el, name, value) {
  value = String(value);
  if (el.getAttribute(name) !== value) el.setAttribute(name, value);
}

export function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Makes parent's children match items, reusing the element made for the
// same key on the previous refresh. Rebuilding everything each second would
// close hover titles, lose focus and make the browser test's element
// handles go stale; reusing keeps all three.
export function reconcile(parent, items, keyOf, create, update) {
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
export function makeRow(n, numeric = []) {
  const tr = el("tr");
  for (let i = 0; i < n; i++) tr.append(el("td", numeric.includes(i) ? { class: "num" } : {}));
  return tr;
}

export function toggleEmpty(id, isEmpty) {
  $(id).hidden = !isEmpty;
}

export function list(v) {
  return Array.isArray(v) ? v.filter((x) => x && typeof x === "object") : [];
}

export function dict(v) {
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

export function ownerColour(owner) {
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
