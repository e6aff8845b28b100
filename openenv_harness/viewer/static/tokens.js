// The token side of a call card: prompt ids (mask 0) and sampled ids (their mask), never decoded.
// Only windows of a long prompt are in the DOM (its end and the divergence point); the gaps
// between them are buttons that fetch more ids on demand.

import { CLASS_LABEL, el, fmt, fmtLogp, getJSON, sessionPath } from "./dom.js";

const EXPAND_STEP = 1024;

/** Whether the call's sampled ids are training data (agent call, evidence ok, record trainable). */
export function trains(call) {
  return call.call_kind === "agent" && call.status === "ok" && call.trainable;
}

function divergence(call) {
  const f = call.fidelity;
  if (!f || (f.class !== "replay_drift" && f.class !== "break") || f.divergence_at === null) return null;
  return { at: f.divergence_at, cls: f.class, tokens: f.drift_tokens, parent: f.parent };
}

/** A bar over the whole sequence: prompt, prompt past the divergence, sampled ids (to scale). */
function sequenceBar(call) {
  const title = `prompt ${fmt(call.prompt_len)} ids · sampled ${fmt(call.completion_len)} ids`;
  const bar = el("div", { class: "seqbar", title });
  const div = divergence(call);
  const parts = [];
  if (div && div.at < call.prompt_len) {
    parts.push(["p", div.at], [`pd-${div.cls}`, call.prompt_len - div.at]);
  } else {
    parts.push(["p", call.prompt_len]);
  }
  parts.push([trains(call) ? "c1" : "c0", call.completion_len]);
  for (const [cls, n] of parts) {
    if (n <= 0) continue;
    const span = el("span", { class: cls });
    span.style.flexGrow = String(n);
    bar.append(span);
  }
  return bar;
}

function divergenceMark(div) {
  const what = div.cls === "break" ? "history departs from" : "sampled ids not replayed verbatim from";
  return el("span", {
    class: `mark ${div.cls}`,
    text: `▼ ${CLASS_LABEL[div.cls]} @${fmt(div.at)}`,
    title: `${what} ${div.parent} at prompt position ${div.at}; ${div.tokens} prompt ids after it`,
  });
}

function mergeSegment(segments, start, ids) {
  const all = segments.concat([{ start, ids }]).sort((a, b) => a.start - b.start);
  const merged = [];
  for (const seg of all) {
    const last = merged[merged.length - 1];
    if (last && seg.start <= last.start + last.ids.length) {
      const overlap = last.start + last.ids.length - seg.start;
      last.ids = last.ids.concat(seg.ids.slice(overlap));
    } else {
      merged.push({ start: seg.start, ids: seg.ids.slice() });
    }
  }
  return merged;
}

function gapButton(from, to, load) {
  const n = to - from;
  const take = Math.min(n, EXPAND_STEP);
  return el("button", {
    class: "gap", type: "button",
    text: `⋯ ${fmt(n)} ids [${fmt(from)}, ${fmt(to)}) · show ${fmt(take)}`,
    title: "load the ids just before the next shown ones",
    onclick: (event) => { event.target.disabled = true; load(Math.max(from, to - take), to); },
  });
}

function promptRegion(call, sessionId) {
  const region = el("div", { class: "prompt-ids" });
  const div = divergence(call);
  let segments = call.prompt_windows.map((w) => ({ start: w.start, ids: w.ids }));

  const render = () => {
    const nodes = [];
    let cursor = 0;
    for (const seg of segments) {
      if (seg.start > cursor) nodes.push(gapButton(cursor, seg.start, load));
      seg.ids.forEach((id, i) => {
        const pos = seg.start + i;
        if (div && pos === div.at) nodes.push(divergenceMark(div));
        const past = div && pos >= div.at;
        nodes.push(el("span", {
          class: past ? `t td-${div.cls}` : "t t0",
          text: id,
          title: `prompt[${pos}] = ${id} · mask 0${past ? ` · after the ${CLASS_LABEL[div.cls]} point` : ""}`,
        }));
      });
      cursor = seg.start + seg.ids.length;
    }
    if (cursor < call.prompt_len) nodes.push(gapButton(cursor, call.prompt_len, load));
    if (div && div.at >= call.prompt_len) nodes.push(divergenceMark(div));
    region.replaceChildren(...nodes);
  };

  const load = async (start, stop) => {
    try {
      const piece = await getJSON(`${sessionPath(sessionId)}/calls/${call.call_index}/tokens`, { part: "prompt", start, stop });
      segments = mergeSegment(segments, piece.start, piece.ids);
      render();
    } catch (err) {
      region.append(el("div", { class: "error-box", text: `could not load prompt ids: ${err.message}` }));
    }
  };
  render();
  return region;
}

function completionRegion(call, sessionId, notReplayed) {
  const region = el("div", { class: "completion-ids" });
  const data = {
    ids: call.completion_ids.slice(), tokens: call.completion_tokens ? call.completion_tokens.slice() : null,
    logps: call.completion_logps.slice(), mask: call.completion_mask.slice(),
  };
  const trained = trains(call);

  const render = () => {
    const nodes = [];
    const n = Math.max(data.ids.length, data.tokens ? data.tokens.length : 0);
    for (let i = 0; i < n; i++) {
      if (notReplayed && i === notReplayed.from) {
        nodes.push(el("span", {
          class: "mark replay_drift", text: `▼ not replayed verbatim in #${notReplayed.by}`,
          title: `call #${notReplayed.by}'s prompt departs from these sampled ids here`,
        }));
      }
      const id = data.ids[i];
      const text = data.tokens && data.tokens[i] !== undefined ? data.tokens[i] : id;
      const on = trained && data.mask[i] === 1;
      let cls = on ? "t t1" : "t tu";
      if (notReplayed && i >= notReplayed.from) cls += " notrep";
      nodes.push(el("span", {
        class: cls, text,
        title: `sampled[${i}] = ${id ?? text} · logp ${fmtLogp(data.logps[i])} · mask ${data.mask[i] ?? 0}`,
      }));
    }
    const rest = call.completion_len - n;
    if (rest > 0) {
      const take = Math.min(EXPAND_STEP, rest);
      nodes.push(el("button", {
        class: "gap", type: "button", text: `⋯ ${fmt(rest)} more sampled ids · show ${fmt(take)}`,
        onclick: (event) => { event.target.disabled = true; load(n, n + take); },
      }));
    }
    region.replaceChildren(...nodes);
  };

  const load = async (start, stop) => {
    try {
      const path = `${sessionPath(sessionId)}/calls/${call.call_index}/tokens`;
      const piece = await getJSON(path, { part: "completion", start, stop });
      data.ids.push(...piece.ids);
      if (data.tokens && piece.tokens) data.tokens.push(...piece.tokens);
      data.logps.push(...piece.logps);
      data.mask.push(...piece.mask);
      render();
    } catch (err) {
      region.append(el("div", { class: "error-box", text: `could not load sampled ids: ${err.message}` }));
    }
  };
  render();
  return region;
}

/** The whole token column of a card. ``notReplayed``: {from, by} when a later call drifted from this one. */
export function tokenPanel(call, sessionId, notReplayed) {
  if (call.status === "failed") {
    return el("div", { class: "toks" }, el("div", { class: "part", text: "no tokens: the engine call failed" }));
  }
  const trained = trains(call);
  let sampledNote = "mask 1 · trained";
  if (!trained) {
    let why = "record not trainable";
    if (call.call_kind !== "agent") why = "aux call";
    else if (call.status !== "ok") why = `${call.status} evidence`;
    sampledNote = `mask 0 · NOT trained (${why})`;
  }
  const warnMask = call.prompt_mask_nonzero > 0
    ? el("div", { class: "error-box", text: `loss mask is non-zero on ${call.prompt_mask_nonzero} prompt positions` })
    : null;
  return el("div", { class: "toks" },
    sequenceBar(call),
    warnMask,
    el("div", { class: "part", text: `prompt · ${fmt(call.prompt_len)} ids · mask 0 (context)` }),
    promptRegion(call, sessionId),
    el("div", { class: "part", text: `sampled · ${fmt(call.completion_len)} ids · ${sampledNote}` }),
    completionRegion(call, sessionId, notReplayed),
  );
}
