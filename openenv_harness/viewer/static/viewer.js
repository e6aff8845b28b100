// The trace viewer page: the sessions list, and per session its summary, chain graph, numbers
// and one card per call. Routing is the URL fragment: #session=<id> (and &call=<index>).

import { ApiError, badge, el, fmt, fmtLogp, fmtRatio, getJSON, sessionPath } from "./dom.js";
import { callCard } from "./calls.js";
import { chainGraph, layoutLines } from "./graph.js";

const EAGER_CARDS = 16;
const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const tableBody = document.querySelector("#session-table tbody");

function route() {
  const params = new URLSearchParams(window.location.hash.replace(/^#/, ""));
  return { session: params.get("session"), call: params.get("call") };
}

function setState(state, text) {
  document.body.dataset.state = state;
  statusLine.textContent = text;
}

function showError(err) {
  if (err instanceof ApiError && err.status === 401) {
    main.replaceChildren(el("div", { class: "error-box" }, "Not logged in (or the recorder restarted with a new token). ",
      el("a", { href: "login", text: "Log in again" })));
  } else {
    main.replaceChildren(el("div", { class: "error-box", text: String(err.message || err) }));
  }
  setState("error", "error");
}

function renderSessions(sessions, selected) {
  const rows = sessions.map((s) => {
    const row = el("tr", { class: `row${s.session_id === selected ? " selected" : ""}`, dataset: { session: s.session_id },
      onclick: () => { window.location.hash = `session=${encodeURIComponent(s.session_id)}`; } },
    el("td", {}, el("div", { class: "sid", text: s.session_id }),
      s.stop_reason ? el("div", { class: "sub", text: `stop: ${s.stop_reason}` }) : null,
      s.last_error ? el("div", { class: "sub", text: `last error: ${s.last_error.message || s.last_error.kind}` }) : null),
    el("td", {}, badge(s.status, s.status)),
    el("td", { text: `${fmt(s.agent_calls)}/${fmt(s.calls)}` }),
    el("td", { text: `${fmt(s.failed_calls)}${s.invalid_calls ? ` +${s.invalid_calls} inv` : ""}` }));
    return row;
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 4, class: "hint", text: "No sessions yet." })));
  tableBody.replaceChildren(...rows);
}

function sessionHeader(session, calls) {
  const counts = { exact: 0, replay_drift: 0, break: 0 };
  for (const c of calls) if (c.fidelity && c.fidelity.class in counts) counts[c.fidelity.class] += 1;
  const { lines } = layoutLines(calls);
  const header = el("div", { class: "panel session-head" },
    el("h2", { text: session.session_id }),
    el("div", {}, badge(session.status, session.status),
      session.stop_reason ? badge("stop", `stop reason: ${session.stop_reason}`, "what ended the session") : null,
      session.harness ? badge("", `harness ${session.harness}`) : null,
      badge("", `template ${session.template_status || "unknown"}`),
      certificationBadge(session.template_certification),
      session.engine_version ? badge("", `engine ${session.engine_version}`) : null),
    el("div", { class: "facts" },
      ...[["calls", `${fmt(session.calls)} (${fmt(session.agent_calls)} agent)`], ["failed", fmt(session.failed_calls)],
        ["invalid", fmt(session.invalid_calls)], ["prompt ids", fmt(session.prompt_tokens)],
        ["sampled ids", fmt(session.completion_tokens)], ["lines", fmt(lines)], ["exact", fmt(counts.exact)],
        ["replay drift", fmt(counts.replay_drift)], ["break", fmt(counts.break)]]
        .map(([k, v]) => el("span", {}, `${k} `, el("b", { text: v })))));
  const budgets = Object.entries(session.budgets || {});
  if (budgets.length) {
    header.append(el("div", { class: "facts", text: `budgets: ${budgets.map(([k, v]) => `${k}=${v}`).join(", ")}` }));
  }
  if (session.last_error) {
    const e = session.last_error;
    header.append(el("div", { class: "error-box" }, el("b", { text: "last error: " }),
      `${e.kind || "error"} · HTTP ${e.status ?? "?"} · ${e.message || ""} (see the failed call below)`));
  }
  return header;
}

function legend() {
  const item = (colour, text) => el("span", {}, el("span", { class: `sw ${colour}` }), text);
  return el("div", { class: "legend" },
    item("t0", "prompt id (mask 0)"), item("t1", "sampled id (mask 1, trained)"), item("tu", "sampled id not trained"),
    item("td-replay_drift", "prompt after a replay-drift point"), item("td-break", "prompt after a break point"),
    item("c-root", "root"), item("c-exact", "exact"), item("c-replay_drift", "replay drift"),
    item("c-break", "break"), item("c-failed", "failed call"), item("c-invalid", "invalid evidence"),
    item("c-aux", "aux call"), item("c-straddle", "straddled a weight sync"));
}

function logprobSummary(calls) {
  let tokens = 0;
  let weighted = 0;
  let low = null;
  for (const c of calls) {
    const lp = c.logprobs;
    if (!lp || lp.mean === null) continue;
    tokens += lp.finite;
    weighted += lp.mean * lp.finite;
    low = low === null ? lp.min : Math.min(low, lp.min);
  }
  return el("div", { class: "facts" },
    el("span", {}, "rollout logprobs over ", el("b", { text: fmt(tokens) }), " sampled ids: mean ",
      el("b", { text: fmtLogp(tokens ? weighted / tokens : null) }), ", min ", el("b", { text: fmtLogp(low) })),
    el("span", { text: "(trainer logprobs are not in the recorder; δ is computed trainer-side)" }));
}

function strategiesTable(assembly) {
  const head = ["strategy", "samples", "exact", "drift", "breaks", "trainable ids", "response ids", "trainable ratio",
    "over all ids", "lost ids", "approximate"];
  const rows = Object.entries(assembly.strategies).map(([name, s]) => {
    const bar = el("span", { class: "ratio" }, el("span", {}));
    bar.firstChild.style.width = `${Math.round(100 * (s.trainable_ratio || 0))}%`;
    return el("tr", { dataset: { strategy: name } },
      el("td", { text: name }), el("td", { text: fmt(s.traces) }), el("td", { text: fmt(s.exact) }),
      el("td", { text: fmt(s.replay_drift) }), el("td", { text: fmt(s.breaks) }), el("td", { text: fmt(s.trainable_tokens) }),
      el("td", { text: fmt(s.response_tokens) }), el("td", {}, fmtRatio(s.trainable_ratio), bar),
      el("td", { text: fmtRatio(s.trainable_ratio_all_tokens) }), el("td", { text: fmt(s.resolutions.lost_tokens) }),
      el("td", { text: fmt(s.approximate_traces) }));
  });
  return el("table", { class: "stats strategies" }, el("tr", {}, head.map((h) => el("th", { text: h }))), rows);
}

/** For each call some later call drifted from: where its sampled ids stop being replayed. */
function notReplayedMap(calls, byNode) {
  const map = new Map();
  for (const c of calls) {
    const f = c.fidelity;
    if (!f || f.class !== "replay_drift" || !byNode.has(f.parent)) continue;
    const parent = byNode.get(f.parent);
    const from = f.divergence_at - parent.prompt_len;
    if (from >= 0 && from < parent.completion_len && !map.has(parent.node_id)) {
      map.set(parent.node_id, { from, by: c.call_index });
    }
  }
  return map;
}

async function showSession(sessionId, focusCall) {
  setState("loading", `loading ${sessionId}…`);
  const [data, assembly] = await Promise.all([
    getJSON(`${sessionPath(sessionId)}/calls`),
    getJSON(`${sessionPath(sessionId)}/assembly`).catch((err) => ({ error: err })),
  ]);
  const calls = data.calls;
  const session = data.session;
  const byNode = new Map(calls.map((c) => [c.node_id, c]));
  const notReplayed = notReplayedMap(calls, byNode);
  const numbers = el("div", { class: "panel" }, el("h3", { text: "Numbers" }), logprobSummary(calls));
  if (assembly.error) numbers.append(el("div", { class: "error-box", text: `assembly: ${assembly.error.message}` }));
  else {
    numbers.append(el("div", { class: "part", text: "What a trainer gets per assembly strategy:" }), strategiesTable(assembly));
  }
  const transitions = new Map((assembly.transitions || []).map((t) => [t.to_node, t]));
  const cards = calls.map((c, i) => callCard(c, sessionId, byNode, notReplayed.get(c.node_id), transitions.get(c.node_id),
    i >= EAGER_CARDS));
  main.replaceChildren(
    sessionHeader(session, calls),
    el("div", { class: "panel" }, el("h3", { text: "Chains and forks" }), legend(),
      el("div", { class: "graph-wrap" }, chainGraph(session, calls))),
    numbers,
    el("h3", { text: `Calls (${calls.length})` }),
    ...(cards.length ? cards : [el("p", { class: "hint", text: "No calls recorded yet." })]));
  if (focusCall !== null) {
    const card = document.getElementById(`call-${focusCall}`);
    if (card) card.scrollIntoView({ block: "start" });
  }
  setState("ready", `${session.session_id}: ${calls.length} calls`);
}

async function refresh() {
  const { session, call } = route();
  try {
    const sessions = await getJSON("sessions");
    sessions.sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
    renderSessions(sessions, session);
    if (session) await showSession(session, call);
    else setState("ready", `${sessions.length} sessions`);
  } catch (err) {
    showError(err);
  }
}

document.getElementById("refresh").addEventListener("click", refresh);
window.addEventListener("hashchange", refresh);
refresh();

/** The served template's certification (recorder/engine_knowledge/certify.py): does it keep chains exact, and if not why. */
function certificationBadge(cert) {
  if (!cert) return null;
  const failed = (cert.failed || []).map((f) => `${f.property}: ${f.detail}`).join("; ");
  const title = cert.status === "uncertified" ? (cert.reason || "") : (failed || "every required property holds");
  return badge(cert.status === "certified" ? "exact" : cert.status === "failed" ? "break" : "",
    `template ${cert.status}`, title);
}
