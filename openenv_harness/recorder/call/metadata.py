"""The metadata every record has, whatever became of its call: its number, kind, status, policy
versions, request digest, dialect and provenance."""

from __future__ import annotations

from typing import Any

from openenv_harness.contract import SCHEMA_VERSION
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.provenance import call_provenance


def base_metadata(flow: Flow, status: str, trainable: bool) -> dict[str, Any]:
    """The metadata every record has. The call gets its number here, when its record is built: a call
    that ends without a record (refused, or unstorable: ``store_record`` gives the number back)
    uses none, so a session's call numbers are its records' positions, with no gap."""
    session = flow.session
    if flow.call_index < 0:
        flow.call_index = session.numbers.take()
    md = {
        "schema_version": SCHEMA_VERSION,
        "node_id": f"{session.id}/{flow.call_index}",
        "session_id": session.id,
        "call_index": flow.call_index,
        "call_kind": flow.call_kind,
        "aux_rule": flow.aux_rule,
        "status": status,
        "trainable": trainable,
        "stream": flow.wants_stream,
        "policy_version_start": flow.version_start,
        "policy_version_end": flow.version_end,
        "straddled_sync": flow.version_start != flow.version_end,
        "request_digest": flow.digest,
        "harness_session_id": flow.headers.get(flow.dialect.session_header),
        "dialect": flow.dialect.name,
        "received_at": flow.received_at,
        "upstream_ms": flow.reply.elapsed_ms if flow.reply is not None else None,
        "provenance": call_provenance(flow.ctx, session, flow.upstream_body or flow.body, flow.body,
                                      flow.reply.headers if flow.reply is not None else None),
    }
    if flow.engine_paused is not None:
        md["engine_paused"] = flow.engine_paused
    return md
