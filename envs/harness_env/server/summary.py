"""Condense a rollout's records into what fits in an observation.

Records carry every prompt's token ids; a 30-call rollout is megabytes. An observation gets the
counts a trainer decides on (calls, tokens, chain status -- the same condensation the
``openenv-harness run`` summary uses) and, in its metadata, one short line per call. The records
themselves are read from the recorder.
"""

from __future__ import annotations

from typing import Any

from openenv_harness.rollout.report import RolloutReport, summarize_records

try:
    from ..models import TraceSummary
except ImportError:  # served as the top-level ``server`` package (uvicorn server.app:app)
    from models import TraceSummary  # type: ignore[no-redef]

#: At most this many per-call lines go into an observation's metadata.
MAX_CALL_DIGESTS = 256


def trace_summary(records: list[dict[str, Any]], session_info: dict[str, Any]) -> TraceSummary:
    report = summarize_records(RolloutReport(session_id="", harness="", task=""), records)
    return TraceSummary(
        calls=report.calls,
        agent_calls=report.agent_calls,
        aux_calls=report.aux_calls,
        failed_calls=report.failed_calls,
        prompt_tokens=report.prompt_tokens,
        completion_tokens=report.completion_tokens,
        chain=dict(report.fidelity),
        chain_status=report.chain_status,
        rows=report.rows,
        stop_reason=session_info.get("stop_reason"),
    )


def call_digests(records: list[dict[str, Any]], limit: int = MAX_CALL_DIGESTS) -> list[dict[str, Any]]:
    """One compact line per call: kind, status, chain class, token counts, finish reason."""
    digests = []
    for record in records[:limit]:
        md = record.get("metadata") or {}
        digests.append({
            "call_index": md.get("call_index"),
            "call_kind": md.get("call_kind"),
            "status": md.get("status"),
            "fidelity": (md.get("fidelity") or {}).get("class"),
            "prompt_tokens": len(record.get("prompt_token_ids") or []),
            "completion_tokens": len(record.get("completion_token_ids") or []),
            "finish_reason": md.get("finish_reason"),
        })
    return digests
