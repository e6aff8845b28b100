"""A session as Harbor's ATIF trajectory (Agent Trajectory Interchange Format), token evidence attached.

Why: a Harbor user reads trajectories with Harbor's own tools (its viewer, its ``Trajectory`` models,
its training converters). This writes what those tools read -- plain JSON of ATIF-v1.7's shape -- and
never imports ``harbor`` (it needs a newer Python than ours and brings a large dependency tree); the
tests validate the output with Harbor's models in a venv of their own.

What maps (``docs/exports.md``):

- the agent's conversation, in order: the first call's ``system`` messages as ``system`` steps, its
  ``user`` messages as ``user`` steps; each agent call (status ok) as one ``agent`` step -- the reply's
  content as ``message``, its reasoning as ``reasoning_content``, its tool calls as ``tool_calls``
  (``arguments`` the parsed JSON object; a call whose text is no JSON object gets ``{}`` and keeps the
  text in ``extra.raw_arguments``) and the ``tool`` messages the next request carries for them as the
  step's ``observation``; ``user`` messages a later request adds are ``user`` steps;
- per agent step, ``metrics``: ``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` exactly
  as recorded, token counts, and in ``metrics.extra`` the record's node id, chain class and cause,
  trainability, whether the logprobs are the policy's, policy versions and the finish reason;
- ``agent``: the harness and its version from the records' provenance, the model, the first call's
  tool list (OpenAI's function schema, as ATIF asks).

What does not map: aux calls (titles, compaction summaries) are no step of the agent's trajectory --
they are listed in ``extra.aux_calls`` by node id; failed calls likewise in ``extra.failed_calls``; a
request whose history was rewritten (compaction) starts over: its messages that are no continuation
become new steps, marked ``extra.history_rewritten``; non-text content parts (images) are left out of
``message`` (``extra.dropped_parts`` counts them); costs are unknown.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

SCHEMA_VERSION = "ATIF-v1.7"


def _text(content: Any) -> tuple[str, int]:
    """A message's text, and how many non-text parts it left out."""
    if isinstance(content, str):
        return content, 0
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(t for t in texts if isinstance(t, str)), len(content) - len(texts)
    return "", 0


def _timestamp(md: dict[str, Any]) -> str | None:
    at = md.get("received_at")
    if isinstance(at, (int, float)):
        return datetime.fromtimestamp(at, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return None


def _reply(record: dict[str, Any]) -> dict[str, Any]:
    response = record.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


def _tool_call(call: dict[str, Any], index: int, node: str) -> dict[str, Any]:
    fn = call.get("function") or {}
    text = fn.get("arguments")
    parsed: Any = None
    if isinstance(text, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    elif isinstance(text, dict):
        parsed = text
    out: dict[str, Any] = {"tool_call_id": str(call.get("id") or f"{node}/call{index}"),
                           "function_name": str(fn.get("name") or ""),
                           "arguments": parsed if isinstance(parsed, dict) else {}}
    if not isinstance(parsed, dict):
        out["extra"] = {"raw_arguments": text}
    return out


def _metrics(record: dict[str, Any]) -> dict[str, Any]:
    md = record.get("metadata") or {}
    prompt = list(record.get("prompt_token_ids") or [])
    completion = list(record.get("completion_token_ids") or [])
    usage: dict[str, Any] = md["usage"] if isinstance(md.get("usage"), dict) else {}
    found = usage.get("prompt_tokens_details")
    details: dict[str, Any] = found if isinstance(found, dict) else {}
    fidelity = md.get("fidelity") or {}
    metrics: dict[str, Any] = {
        "prompt_tokens": len(prompt), "completion_tokens": len(completion),
        "prompt_token_ids": prompt, "completion_token_ids": completion,
        "logprobs": list(record.get("per_token_logps") or []),
        "extra": {
            "node_id": md.get("node_id"), "fidelity": fidelity.get("class"), "cause": fidelity.get("cause"),
            "parent": fidelity.get("parent"), "trainable": md.get("trainable"),
            "logprobs_are_policy": md.get("logprobs_are_policy"), "finish_reason": md.get("finish_reason"),
            "policy_version_start": md.get("policy_version_start"), "policy_version_end": md.get("policy_version_end"),
            "straddled_sync": md.get("straddled_sync"), "dialect": md.get("dialect"),
        },
    }
    if details.get("cached_tokens"):
        metrics["cached_tokens"] = details["cached_tokens"]
    return metrics


class _Builder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.seen: list[dict[str, Any]] = []  # the messages already in the steps, as the last request sent them
        self.open_calls: dict[str, dict[str, Any]] = {}  # tool call id -> the agent step that made it

    def step(self, source: str, **fields: Any) -> dict[str, Any]:
        step = {"step_id": len(self.steps) + 1, "source": source, **{k: v for k, v in fields.items() if v is not None}}
        self.steps.append(step)
        return step

    def messages(self, messages: list[Any], timestamp: str | None, rewritten: bool) -> None:
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            text, dropped = _text(message.get("content"))
            extra: dict[str, Any] = {}
            if dropped:
                extra["dropped_parts"] = dropped
            if rewritten:
                extra["history_rewritten"] = True
            if role == "tool":
                owner = self.open_calls.get(str(message.get("tool_call_id")))
                result = {"source_call_id": str(message.get("tool_call_id")), "content": text}
                if owner is not None:
                    owner.setdefault("observation", {"results": []})["results"].append(result)
                    continue
                self.step("system", message=text, observation={"results": [result]}, extra=extra or None)
            elif role == "assistant":  # an assistant turn no recorded call of ours sampled (a summary put back)
                self.step("agent", message=text, timestamp=timestamp, llm_call_count=0, extra=extra or None)
            else:
                self.step("system" if role in ("system", "developer") else "user", message=text,
                          timestamp=timestamp, extra=extra or None)

    def call(self, record: dict[str, Any]) -> None:
        md = record.get("metadata") or {}
        request = record.get("request") or {}
        messages = [m for m in request.get("messages") or []]
        timestamp = _timestamp(md)
        shared = 0
        while shared < min(len(messages), len(self.seen)) and _same_turn(messages[shared], self.seen[shared]):
            shared += 1
        rewritten = bool(self.seen) and shared < len(self.seen)
        self.messages(messages[shared:], timestamp, rewritten)
        reply = _reply(record)
        node = str(md.get("node_id") or len(self.steps))
        text, _ = _text(reply.get("content"))
        reasoning = reply.get("reasoning") or reply.get("reasoning_content")
        calls = [_tool_call(c, i, node) for i, c in enumerate(reply.get("tool_calls") or []) if isinstance(c, dict)]
        step = self.step("agent", timestamp=timestamp, model_name=request.get("model"), message=text,
                         reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
                         tool_calls=calls or None, metrics=_metrics(record), llm_call_count=1,
                         extra={"history_rewritten": True} if rewritten else None)
        self.open_calls = {c["tool_call_id"]: step for c in calls}
        self.seen = [*messages, {"role": "assistant"}]


def _same_turn(sent: Any, seen: Any) -> bool:
    """Whether a request's message is the one already in the steps: equal, or -- where the agent replays
    our reply -- an assistant message in the same place (its text is the agent's re-serialization)."""
    if isinstance(seen, dict) and seen == {"role": "assistant"}:
        return isinstance(sent, dict) and sent.get("role") == "assistant"
    return bool(sent == seen)


def atif_trajectory(records: list[dict[str, Any]], *, session_id: str | None = None) -> dict[str, Any]:
    """The session's records as one ATIF trajectory (a JSON-ready dict); ``ValueError`` when no agent
    call of the session succeeded (ATIF needs at least one step)."""
    builder = _Builder()
    aux: list[str] = []
    failed: list[str] = []
    agent_records = []
    for record in records:
        md = record.get("metadata") or {}
        if md.get("call_kind", "agent") != "agent":
            aux.append(str(md.get("node_id")))
        elif md.get("status", "ok") != "ok":
            failed.append(str(md.get("node_id")))
        else:
            agent_records.append(record)
            builder.call(record)
    if not agent_records:
        raise ValueError("no agent call of this session succeeded: an ATIF trajectory needs at least one step")
    first = agent_records[0]
    md = first.get("metadata") or {}
    provenance = md.get("provenance") or {}
    agent: dict[str, Any] = {"name": str(provenance.get("harness") or "unknown"),
                             "version": str(provenance.get("harness_version") or "unknown"),
                             "model_name": (first.get("request") or {}).get("model") or provenance.get("model")}
    tools = (first.get("request") or {}).get("tools")
    if isinstance(tools, list) and tools:
        agent["tool_definitions"] = tools
    agent["extra"] = {"recorder_version": provenance.get("recorder_version"), "engine": provenance.get("engine_version")}
    totals = [((r.get("metadata") or {}).get("usage") or {}) for r in agent_records]
    extra: dict[str, Any] = {"recorded_by": "openenv-harness", "aux_calls": aux, "failed_calls": failed}
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id or md.get("session_id"),
        "agent": agent,
        "steps": builder.steps,
        "notes": "Recorded by openenv-harness: per agent step, metrics hold the exact prompt and sampled token "
                 "ids and logprobs of the call; aux and failed calls are listed in extra, not as steps.",
        "final_metrics": {
            "total_prompt_tokens": sum(len(r.get("prompt_token_ids") or []) for r in agent_records),
            "total_completion_tokens": sum(len(r.get("completion_token_ids") or []) for r in agent_records),
            "total_cached_tokens": sum(((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                                       for u in totals),
            "total_steps": len(builder.steps),
        },
        "extra": extra,
    }
