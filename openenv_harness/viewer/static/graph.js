// The chain and fork structure of a session, as an SVG: one node per call, in call order, linked
// to its fidelity parent and coloured by class. A call continues its parent's line when the parent
// is that line's last call and the step is not a break; otherwise it opens a new line (a fork or a
// break), so forks are visible as branches. Failed and aux calls sit on their own row.

import { CLASS_LABEL, fmt, svg } from "./dom.js";

const COLOUR = {
  root: "#64748b", exact: "#2563eb", replay_drift: "#f59e0b", break: "#dc2626",
  failed: "#111827", aux: "#a855f7", invalid: "#dc2626", straddle: "#7c3aed",
};
const LEFT = 92;
const TOP = 26;
const LANE_H = 38;

/** Line index of every call that has a fidelity class; ``lines`` is how many lines there are. */
export function layoutLines(calls) {
  const lineOf = new Map();
  const tips = [];
  for (const call of calls) {
    const f = call.fidelity;
    if (!f) continue;
    const parentLine = f.parent !== null && f.parent !== undefined ? lineOf.get(f.parent) : undefined;
    let line;
    if (f.class !== "break" && parentLine !== undefined && tips[parentLine] === f.parent) {
      line = parentLine;
    } else {
      line = tips.length;
      tips.push(null);
    }
    tips[line] = call.node_id;
    lineOf.set(call.node_id, line);
  }
  return { lineOf, lines: tips.length };
}

function nodeTitle(call) {
  const f = call.fidelity;
  const parts = [`#${call.call_index} ${call.node_id}`, `${call.call_kind} · ${call.status}`];
  if (f) {
    parts.push(`${CLASS_LABEL[f.class] || f.class}${f.parent ? ` from ${f.parent}` : ""}`);
    if (f.divergence_at !== null && f.divergence_at !== undefined) {
      parts.push(`diverges at prompt[${f.divergence_at}], ${f.drift_tokens} ids after`);
    }
  }
  if (call.error) parts.push(`error: ${call.error.message}`);
  if (call.straddled_sync) parts.push(`straddled weight sync v${call.policy_version_start}→v${call.policy_version_end}`);
  return parts.join("\n");
}

function scrollToCall(index) {
  const card = document.getElementById(`call-${index}`);
  if (card) card.scrollIntoView({ behavior: "smooth", block: "start" });
}

export function chainGraph(session, calls) {
  const { lineOf, lines } = layoutLines(calls);
  const outside = calls.some((c) => !c.fidelity);
  const step = calls.length <= 24 ? 48 : Math.max(16, Math.floor(1100 / calls.length));
  const r = Math.max(5, Math.min(10, step / 2.6));
  const rows = lines + (outside ? 1 : 0);
  const stopWidth = session && session.stop_reason ? 200 : 20;
  const width = LEFT + calls.length * step + stopWidth;
  const height = TOP + Math.max(rows, 1) * LANE_H + 8;
  const root = svg("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "chain and fork structure of the session's calls" });

  const x = (i) => LEFT + i * step + step / 2;
  const y = (row) => TOP + row * LANE_H + LANE_H / 2;
  const pos = new Map();
  calls.forEach((call, i) => {
    const row = call.fidelity ? lineOf.get(call.node_id) : lines;
    pos.set(call.node_id, { x: x(i), y: y(row) });
  });

  for (let row = 0; row < lines; row++) {
    root.append(svg("text", { class: "lane-label", x: 4, y: y(row) + 3, text: `line ${row + 1}` }));
  }
  if (outside) root.append(svg("text", { class: "lane-label", x: 4, y: y(lines) + 3, text: "failed / aux" }));

  // weight syncs: a dashed line before the first call that starts on a new policy version (a call
  // that was in flight during the sync carries a ring of its own)
  let version = null;
  calls.forEach((call, i) => {
    if (version === null || call.policy_version_start !== version) {
      const vx = x(i) - step / 2;
      if (version !== null) root.append(svg("line", { class: "version-line", x1: vx, y1: 12, x2: vx, y2: height - 4 }));
      root.append(svg("text", { class: "version-label", x: vx + 2, y: 11, text: `policy v${call.policy_version_start}` }));
    }
    version = call.policy_version_start;
  });

  const edges = svg("g");
  const nodes = svg("g");
  root.append(edges, nodes);
  for (const call of calls) {
    const f = call.fidelity;
    const to = pos.get(call.node_id);
    if (f && f.parent && pos.has(f.parent)) {
      const from = pos.get(f.parent);
      const colour = COLOUR[f.class] || COLOUR.root;
      const mx = (from.x + to.x) / 2;
      const d = from.y === to.y ? `M ${from.x} ${from.y} L ${to.x} ${to.y}`
        : `M ${from.x} ${from.y} C ${mx} ${from.y}, ${mx} ${to.y}, ${to.x} ${to.y}`;
      const edge = svg("path", { d, fill: "none", stroke: colour, "stroke-width": 3,
        "stroke-dasharray": f.class === "break" ? "6 4" : null });
      edge.append(svg("title", { text: `${CLASS_LABEL[f.class]}: ${f.parent} → ${call.node_id}` }));
      edges.append(edge);
      if (f.divergence_at !== null && f.divergence_at !== undefined) {
        edges.append(svg("text", { class: "edge-label", x: mx, y: Math.min(from.y, to.y) - r - 3, fill: colour,
          "text-anchor": "middle", text: `@${fmt(f.divergence_at)}` }));
      }
    }
    const g = svg("g", { class: "node" });
    g.addEventListener("click", () => scrollToCall(call.call_index));
    g.append(svg("title", { text: nodeTitle(call) }));
    if (call.straddled_sync) {
      g.append(svg("circle", { cx: to.x, cy: to.y, r: r + 4, fill: "none", stroke: COLOUR.straddle, "stroke-width": 2 }));
    }
    if (call.status === "failed") {
      g.append(svg("rect", { x: to.x - r, y: to.y - r, width: 2 * r, height: 2 * r, rx: 2, fill: COLOUR.failed }));
      g.append(svg("text", { class: "node-label", x: to.x, y: to.y + 3.5, "text-anchor": "middle", text: "✕" }));
    } else if (!f) {
      g.append(svg("circle", { cx: to.x, cy: to.y, r, fill: "#fff", stroke: COLOUR.aux, "stroke-width": 2.5 }));
    } else {
      const colour = COLOUR[f.class] || COLOUR.root;
      const invalid = call.status !== "ok";
      g.append(svg("circle", { cx: to.x, cy: to.y, r, fill: invalid ? "#fff" : colour,
        stroke: invalid ? COLOUR.invalid : colour, "stroke-width": invalid ? 3 : 1,
        "stroke-dasharray": invalid ? "3 2" : null }));
      if (!invalid && step >= 30) {
        g.append(svg("text", { class: "node-label", x: to.x, y: to.y + 3.5, "text-anchor": "middle", text: call.call_index }));
      }
    }
    if (step >= 30 && (call.status === "failed" || !f || call.status !== "ok")) {
      g.append(svg("text", { x: to.x, y: to.y + r + 11, "text-anchor": "middle", fill: "#334155",
        text: `#${call.call_index}` }));
    }
    nodes.append(g);
  }

  if (session && session.stop_reason) {
    const sx = x(calls.length - 1) + step / 2 + 8;
    const sy = y(0);
    root.append(svg("rect", { x: sx, y: sy - 10, width: 184, height: 20, rx: 3, fill: "#fef3c7", stroke: "#d97706" }));
    root.append(svg("text", { x: sx + 6, y: sy + 4, fill: "#78350f", text: `■ stopped: ${session.stop_reason}` }));
  }
  return root;
}
