// Small helpers shared by the viewer's modules.
// Every piece of record text goes through textContent or setAttribute, never through HTML
// parsing: records hold whatever an agent or an engine wrote.

export const SVG_NS = "http://www.w3.org/2000/svg";

export const CLASS_LABEL = { root: "root", exact: "exact", replay_drift: "replay drift", break: "break" };

/** An element with properties (class, text, title, onclick, dataset, any attribute) and children. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  setProps(node, props);
  append(node, children);
  return node;
}

/** An SVG element; attributes are set verbatim, ``text`` becomes its text content. */
export function svg(tag, props = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setProps(node, props);
  append(node, children);
  return node;
}

function setProps(node, props) {
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key === "text") node.textContent = String(value);
    else if (key === "onclick") node.addEventListener("click", value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
}

export function badge(cls, text, title) {
  return el("span", { class: `badge ${cls}`, text, title });
}

export function fmt(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

export function fmtLogp(x) {
  return x === null || x === undefined ? "—" : Number(x).toFixed(3);
}

export function fmtRatio(x) {
  return x === null || x === undefined ? "—" : `${(100 * x).toFixed(1)}%`;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(`HTTP ${status}: ${message}`);
    this.status = status;
  }
}

// Resolved against the page (/viewer/), so the viewer also works behind a path prefix.
const ADMIN_BASE = new URL("../admin/", window.location.href);

/** GET an admin JSON route with the login cookie; errors carry the recorder's message. */
export async function getJSON(path, params = {}) {
  const url = new URL(path, ADMIN_BASE);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, String(value));
  const response = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
  if (!response.ok) {
    let message = response.statusText;
    try {
      const body = await response.json();
      message = (body.error && (body.error.message || body.error)) || message;
    } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, message);
  }
  return response.json();
}

export function sessionPath(sessionId) {
  return `viewer/api/sessions/${encodeURIComponent(sessionId)}`;
}
