"""A finished agent run, as OpenEnv's ``HarnessRolloutResult``: built from what the recorder saw.

Why from the records: an opaque CLI reports little (Pi exits 0 on failure; neither prints its
tool results in a stable form), while the recorder saw every model call, every reply the agent
received and -- in the agent's next request -- every tool result it sent back. So the result says
what happened without the trainer reading the store:

- ``prompt_ids`` / ``completion_ids`` / ``logprobs``: the agent calls whose evidence is trainable,
  in call order; one ``model_call`` event per such call, in the same order.
- ``events``: also ``model_call_invalid`` (evidence failed validation), ``model_call_failed``
  (the engine or the trainer's ``ModelStep`` gave no answer: the error it raised), ``tool_call``
  (each tool call the agent received), ``tool_calls_cut`` (a tool-call cap dropped some) and
  ``stopped`` (a recorder budget ended the session).
- ``tool_trace``: each tool call the agent received, its result the tool message the agent sent
  back with the same ``tool_call_id``. A call whose result never reached the recorder (the agent
  was stopped or killed after running it) has ``data=None`` and ``metadata.result_seen=False``.
  ``ToolResult.error`` stays ``None``: chat tool messages carry text, not an error flag.
- ``done`` follows RFC 005's meaning: the agent finished on its own. A budget stop, a tool-call
  cap that stopped the session, a timeout or a failed run leave it ``False``
  (``metrics.truncated`` says a limit cut the run, ``metrics.stop_reason`` which).
- ``metrics.exit_code`` is the agent's verdict (0 only when it succeeded), the same the session
  factory and the environment report; the process's own status is ``metrics.process_exit_code``.
- ``metrics.error``: why the run went wrong, the recorder's last call error first (a failed
  ``ModelStep`` says ``model_step raised ...``), else the agent's own; ``metrics.errors`` lists
  every failed call. ``metrics.trace_entries`` holds every record, failed ones included.
"""

from __future__ import annotations

import json
from typing import Any

from openenv.core.harness import HarnessRolloutResult, RolloutEvent, ToolResult, ToolTraceEntry, VerifyResult

from openenv_harness.contract import is_training_entry
from openenv_harness.harnesses.base import HarnessResult


def _message_of(record: dict[str, Any]) -> dict[str, Any] | None:
    choices = (record.get("response") or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else None


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw": raw}


def _tool_results(records: list[dict[str, Any]]) -> dict[str, Any]:
    """tool_call_id -> the content of the tool message the agent sent back (latest request wins)."""
    results: dict[str, Any] = {}
    for record in records:
        for message in (record.get("request") or {}).get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "tool" and message.get("tool_call_id"):
                results[str(message["tool_call_id"])] = message.get("content")
    return results


def _failure(md: dict[str, Any]) -> dict[str, Any]:
    error = md.get("error") or {}
    return {"node_id": md.get("node_id"), "call_kind": md.get("call_kind"), "kind": error.get("kind"),
            "status": error.get("status"), "message": error.get("message")}


def _walk(records: list[dict[str, Any]], result: HarnessRolloutResult) -> dict[str, int]:
    """Events, tool trace and token lists, in call order; returns the call counts."""
    seen = _tool_results(records)
    counts = {"agent_calls": 0, "aux_calls": 0, "failed_calls": 0, "invalid_calls": 0, "tool_calls_cut": 0}
    for record in records:
        md = record.get("metadata") or {}
        kind, status = md.get("call_kind", "agent"), md.get("status", "ok")
        if status == "failed":
            counts["failed_calls"] += 1
            result.events.append(RolloutEvent(type="model_call_failed", payload=_failure(md)))
            continue
        counts["aux_calls" if kind == "aux" else "agent_calls"] += 1
        if is_training_entry(record):
            result.prompt_ids.extend(record["prompt_token_ids"])
            result.completion_ids.extend(record["completion_token_ids"])
            result.logprobs.extend(record["per_token_logps"])
            result.events.append(RolloutEvent(type="model_call", payload={
                "node_id": md["node_id"], "fidelity": md.get("fidelity"), "finish_reason": md.get("finish_reason"),
                "prompt_tokens": len(record["prompt_token_ids"]),
                "completion_tokens": len(record["completion_token_ids"]),
            }))
        elif kind == "agent":
            counts["invalid_calls"] += 1
            result.events.append(RolloutEvent(type="model_call_invalid", payload={
                "node_id": md.get("node_id"), "reasons": list(md.get("invalid_reasons") or [])}))
        cut = md.get("tool_limit")
        if cut:
            counts["tool_calls_cut"] += 1
            result.events.append(RolloutEvent(type="tool_calls_cut", payload={
                "node_id": md.get("node_id"), "cap": cut.get("cap"), "sampled": cut.get("sampled"),
                "delivered": cut.get("delivered")}))
        for call in (_message_of(record) or {}).get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            name = str((call.get("function") or {}).get("name") or "")
            arguments = _arguments(call)
            call_id = str(call.get("id") or "")
            result_seen = call_id in seen
            result.tool_trace.append(ToolTraceEntry(tool_name=name, arguments=arguments, result=ToolResult(
                data=seen.get(call_id), metadata={"tool_call_id": call_id, "node_id": md.get("node_id"),
                                                  "result_seen": result_seen})))
            result.events.append(RolloutEvent(type="tool_call", payload={
                "tool_name": name, "arguments": arguments, "node_id": md.get("node_id"), "result_seen": result_seen}))
    return counts


def transcript(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last trainable agent call's messages plus the reply the agent received."""
    agent = [r for r in records if is_training_entry(r)]
    if not agent:
        return []
    messages = list((agent[-1].get("request") or {}).get("messages") or [])
    reply = _message_of(agent[-1])
    if reply is not None:
        messages.append(reply)
    return messages


def rollout_result(*, records: list[dict[str, Any]], session: dict[str, Any], outcome: HarnessResult,
                   verified: VerifyResult, process_exit_code: int | None, timed_out: bool,
                   unscored: str | None = None) -> HarnessRolloutResult:
    """The ``HarnessRolloutResult`` of one finished run (see the module docstring).

    ``session`` is the recorder's session summary; ``verified`` the task's score of the final state;
    ``unscored`` the infrastructure cause (``rollout.unscored``) that keeps the run from being scored.
    """
    result = HarnessRolloutResult(messages=transcript(records))
    counts = _walk(records, result)
    stop_reason = session.get("stop_reason")
    if stop_reason:
        result.events.append(RolloutEvent(type="stopped", payload={"reason": stop_reason}))
    errors = [_failure(r.get("metadata") or {}) for r in records
              if (r.get("metadata") or {}).get("status") == "failed"]
    last_error = (session.get("last_error") or {}).get("message") or (errors[-1]["message"] if errors else None)
    error = last_error or (None if outcome.ok else outcome.error)
    env_reward = None if unscored else verified.env_reward
    if unscored is None and not outcome.ok and not stop_reason and last_error:
        # the agent stopped because its model call failed, not on the task: a score would put an
        # infrastructure fault into the group baseline (D7)
        unscored, env_reward = f"agent stopped on a model call error: {last_error}", None
    result.done = outcome.ok and not stop_reason and not timed_out
    result.metrics = {
        "session_id": session.get("session_id"),
        "exit_code": None if timed_out else outcome.exit_code,
        "process_exit_code": process_exit_code,
        "timed_out": timed_out,
        "agent_ok": outcome.ok,
        "final_answer": outcome.final_answer,
        "agent_error": outcome.error,
        "error": error,
        "errors": errors,
        "stop_reason": stop_reason,
        "truncated": bool(stop_reason) or timed_out,
        **counts,
        "turns": counts["agent_calls"],
        "tool_calls": len(result.tool_trace),
        "env_reward": env_reward,
        "unscored_reason": unscored,
        "verify": verified.metrics,
        "trace_entries": records,
    }
    return result
