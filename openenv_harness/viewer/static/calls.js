// One card per recorded call: what was said (the request's last messages and the reply) beside
// the tokens, with the facts that decide whether a trainer can use the call.

import { CLASS_LABEL, badge, el, fmt, fmtLogp } from "./dom.js";
import { tokenPanel, trains } from "./tokens.js";

function messageBlock(message, extraClass) {
  const role = message.role || "?";
  const block = el("div", { class: `msg ${role} ${extraClass || ""}` },
    el("div", { class: "role", text: extraClass === "reply" ? `${role} · reply (sampled)` : role }));
  if (message.reasoning) block.append(el("div", { class: "text reasoning", text: `[reasoning] ${message.reasoning}` }));
  if (message.content) block.append(el("div", { class: "text", text: message.content }));
  for (const call of message.tool_calls || []) {
    block.append(el("div", { class: "tc", text: `→ ${call.name}(${call.arguments})`, title: call.id || "" }));
  }
  if (message.tool_call_id) block.firstChild.title = `tool_call_id ${message.tool_call_id}`;
  if (message.truncated) block.append(el("div", { class: "earlier", text: "(cut; the full text is in the record)" }));
  return block;
}

function messagesColumn(call) {
  const column = el("div", { class: "msgs" });
  const earlier = call.messages_total - call.messages.length;
  if (earlier > 0) {
    column.append(el("div", { class: "earlier", text: `… ${earlier} earlier message${earlier > 1 ? "s" : ""}` }));
  }
  for (const message of call.messages) column.append(messageBlock(message));
  if (call.response) column.append(messageBlock(call.response, "reply"));
  return column;
}

export function errorBox(error) {
  const head = [`${error.kind || "error"}`];
  if (error.status) head.push(`agent got HTTP ${error.status}`);
  if (error.upstream_status) head.push(`engine answered HTTP ${error.upstream_status}`);
  const box = el("div", { class: "error-box" },
    el("div", {}, el("b", { text: "call failed · " }), head.join(" · ")),
    el("div", { class: "error-message", text: error.message || "" }));
  if (error.upstream_body !== null && error.upstream_body !== undefined) {
    const body = typeof error.upstream_body === "string" ? error.upstream_body : JSON.stringify(error.upstream_body, null, 2);
    box.append(el("div", { class: "earlier", text: "the engine's original error:" }), el("pre", { text: body }));
  }
  return box;
}

function limitsText(limits) {
  const cap = (used, max) => (max === undefined || max === null ? fmt(used) : `${fmt(used)}/${fmt(max)}`);
  return [
    `agent calls ${cap(limits.agent_calls, limits.max_agent_calls)}`,
    `calls ${cap(limits.calls, limits.max_calls)}`,
    `prompt ${cap(limits.prompt_tokens, limits.max_prompt_tokens)}`,
    `sampled ${cap(limits.completion_tokens, limits.max_completion_tokens)}`,
  ].join(" · ");
}

function headBadges(call, byNode) {
  const agent = call.call_kind === "agent";
  const badges = [badge(agent ? "" : "aux", agent ? "agent" : `aux${call.aux_rule ? ` (${call.aux_rule})` : ""}`)];
  badges.push(badge(call.status, call.status));
  if (call.status !== "failed" && !trains(call)) {
    const reasons = call.invalid_reasons.length ? `: ${call.invalid_reasons.join("; ")}` : "";
    badges.push(badge("untrainable", `untrainable${reasons}`));
  }
  const f = call.fidelity;
  if (f) {
    let text = CLASS_LABEL[f.class] || f.class;
    if (f.parent) {
      const parent = byNode.get(f.parent);
      text += ` ← #${parent ? parent.call_index : f.parent}`;
    }
    if (f.divergence_at !== null && f.divergence_at !== undefined) {
      text += ` @${fmt(f.divergence_at)} (${fmt(f.drift_tokens)} ids after)`;
    }
    badges.push(badge(f.class, text, "fidelity: how this call's prompt continues its parent"));
  }
  if (call.finish_reason) badges.push(badge("", `finish ${call.finish_reason}`));
  const v0 = call.policy_version_start;
  const v1 = call.policy_version_end;
  badges.push(badge("", v0 === v1 ? `policy v${v0}` : `policy v${v0}→v${v1}`));
  if (call.straddled_sync) badges.push(badge("straddled", "straddled weight sync"));
  if (call.limits && call.limits.stop) badges.push(badge("stop", `budget hit: ${call.limits.stop}`));
  return badges;
}

/** What the recorder saw as the reason a call does not continue its parent exactly (drift_cause.py). */
const DRIFT_CAUSE = {
  reasoning_dropped: "the agent sent the answer back without its reasoning",
  reasoning_renamed: "the agent sent the reasoning back under another field name, which the engine does not render",
  reasoning_not_rendered: "the served template does not render the reasoning field the agent replays",
  tool_arguments_reserialized: "the agent re-serialized the sampled tool-call arguments (same JSON, other text)",
  content_reflattened: "the agent sent the text back as a list of parts (or the reverse)",
  edited_message: "the replayed message differs from what was sampled",
  tag_sampled_as_text: "the model sampled the tool-call tag as text pieces; the template renders it as one special id",
  junction_retokenized: "no message changed, but the template tokenizes the end of the generation prompt together with the sampled turn (its turn start failed certification; incremental mode continues such turns exactly)",
  template_rerenders_turn: "the served template renders a finished assistant turn differently once more follows it (its certification failed)",
  tool_arguments_restyled: "the template renders the sampled tool arguments in its own JSON style, not as the model spaced them",
  retokenized: "the answer came back verbatim, but the template tokenizes it differently from how it was sampled",
  resample: "the same prompt as an earlier call (a retry or a sibling sample)",
  sub_agent: "another system prompt: a sub-agent",
  history_rewritten: "earlier messages were replaced or removed (compaction)",
  unknown: "no rule matched",
};

const BREAK_CAUSE = {
  resample: "the same prompt as an earlier call (a retry or a sibling sample)",
  retokenized_tail: "recent turns were re-rendered (template or harness re-serialized them)",
  sub_agent: "a sub-agent: a short shared prefix, and both lines go on",
  history_rewrite: "the history was rewritten (compaction): the old line ends here",
  unknown: "no rule matched",
};

/** One sentence on how this call continues its parent, with the assembler's break cause if known. */
function explanation(call, byNode, transition) {
  const f = call.fidelity;
  if (!f) return null;
  const parent = f.parent && byNode.has(f.parent) ? `#${byNode.get(f.parent).call_index}` : f.parent;
  let text;
  if (f.class === "root") text = "root: the first agent call of its session.";
  else if (f.class === "exact") {
    text = `exact: the prompt is ${parent}'s prompt + its sampled ids + new context; `
      + "a trainer appends it with zero drift.";
  }
  else if (f.class === "replay_drift") {
    text = `replay drift: the prompt starts with ${parent}'s prompt, but ${parent}'s sampled ids were not replayed verbatim `
      + `(the agent re-serialized or the engine re-tokenized its answer): the prompt departs from them at `
      + `prompt[${fmt(f.divergence_at)}] (${fmt(f.drift_tokens)} ids from there on). `
      + "TRL forks here; the assembly strategy decides what to keep.";
    if (f.cause) text += ` Cause: ${f.cause} (${DRIFT_CAUSE[f.cause] || ""}).`;
  } else if (f.class === "break") {
    text = `break: the history changed; this prompt shares only its first ${fmt(f.divergence_at)} ids `
      + `with the nearest earlier prompt (${parent}) and starts a new line.`;
    if (f.cause) text += ` Cause: ${f.cause} (${DRIFT_CAUSE[f.cause] || ""}).`;
    if (transition && transition.cause) text += ` Assembler: ${transition.cause} (${BREAK_CAUSE[transition.cause] || ""}).`;
  } else text = `${f.class}`;
  return el("div", { class: `why ${f.class}`, text });
}

function facts(call) {
  const lp = call.logprobs;
  const items = [
    ["prompt", `${fmt(call.prompt_len)} ids`],
    ["sampled", `${fmt(call.completion_len)} ids`],
    ["rollout logp mean", fmtLogp(lp.mean)],
    ["min", fmtLogp(lp.min)],
  ];
  if (call.upstream_ms !== null && call.upstream_ms !== undefined) items.push(["engine", `${call.upstream_ms.toFixed(0)} ms`]);
  if (call.limits) items.push(["limits", limitsText(call.limits)]);
  const v = call.verification;
  if (v) {
    // trace verify: the trainer's own logprobs of these sampled ids against the rollout's
    const kind = v.constrained ? " (constrained: not the policy's logprobs)" : "";
    if (v.refused) {
      items.push(["step-0", `not scored: ${v.refused.join("; ")}`]);
    } else {
      const logRatio = v.mean_log_ratio === null || v.mean_log_ratio === undefined ? ""
        : `, mean log ratio ${v.mean_log_ratio >= 0 ? "+" : ""}${v.mean_log_ratio.toFixed(4)}`;
      items.push(["step-0 δ max", `${v.delta_max.toFixed(4)}, ratios ${v.ratio_min.toFixed(3)}–${v.ratio_max.toFixed(3)}${logRatio}${kind}`]);
    }
    if (v.verdict) items.push(["session verdict", v.verdict]);
  }
  return el("div", { class: "facts" }, items.map(([k, v]) => el("span", {}, `${k} `, el("b", { text: v }))));
}

/** ``notReplayed``: when a later call drifted from this one, {from: sampled offset, by: its index}. */
export function callCard(call, sessionId, byNode, notReplayed, transition, lazy) {
  const classes = ["card", call.fidelity ? call.fidelity.class : "", call.status === "failed" ? "failed" : "",
    call.status === "invalid" ? "invalid" : "", call.call_kind !== "agent" ? "aux" : ""];
  const card = el("section", { class: classes.filter(Boolean).join(" "), id: `call-${call.call_index}`,
    dataset: { node: call.node_id, status: call.status, fidelity: call.fidelity ? call.fidelity.class : "none" } },
  el("div", { class: "card-head" },
    el("span", { class: "idx", text: `#${call.call_index}` }),
    el("span", { class: "node", text: call.node_id }),
    headBadges(call, byNode)),
  facts(call),
  explanation(call, byNode, transition));
  const tokens = el("div", { class: "tokens-col" });
  card.append(el("div", { class: "card-body" }, messagesColumn(call), tokens));
  const fill = () => tokens.replaceChildren(
    ...[tokenPanel(call, sessionId, notReplayed), call.error ? errorBox(call.error) : null].filter(Boolean));
  if (lazy && "IntersectionObserver" in window) {
    tokens.append(el("div", { class: "part", text: "tokens load when scrolled into view" }));
    const observer = new IntersectionObserver((seen) => {
      if (seen.some((entry) => entry.isIntersecting)) { observer.disconnect(); fill(); }
    }, { rootMargin: "600px" });
    observer.observe(card);
  } else {
    fill();
  }
  return card;
}
