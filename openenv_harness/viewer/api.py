"""The viewer's data routes: call digests, token slices and assembly numbers, admin-only.

They sit under ``/admin`` and use the control plane's own ``require_admin``, so the page reads
exactly what a trainer could read, with the same credential. Work proportional to a session's
size (decoding records, digesting, assembling) runs in a worker thread: the recorder's event loop
keeps serving agents while someone browses a large session.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from starlette.responses import Response

from openenv_harness.recorder.admin.access import require_admin
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import error_response
from openenv_harness.viewer.digest import (
    DEFAULT_AROUND,
    DEFAULT_COMPLETION,
    DEFAULT_MESSAGES,
    DEFAULT_TAIL,
    MAX_SLICE,
    DigestOptions,
    call_digest,
    token_slice,
)
from openenv_harness.viewer.strategies import StrategyStatsError, strategy_stats
from openenv_harness.viewer.verifications import load_verification

API_PREFIX = "/admin/viewer/api"

api_router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_admin)])


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json", headers={"cache-control": "no-store"})


def _not_found(message: str) -> Response:
    # answered directly: the app's 404 handler would replace an HTTPException's detail with "no route"
    return error_response(404, message, code="not_found")


async def _records(request: Request, session_id: str) -> list[dict[str, Any]] | None:
    """The session's records, or None when there is no such session."""
    ctx: RecorderContext = request.app.state.ctx
    if ctx.sessions.get(session_id) is None:
        return None
    return await ctx.store.read_records(session_id)


@api_router.get("/sessions/{session_id}/calls")
async def session_calls(
    session_id: str,
    request: Request,
    messages: int = Query(DEFAULT_MESSAGES, ge=0, le=64),
    tail: int = Query(DEFAULT_TAIL, ge=0, le=MAX_SLICE),
    around: int = Query(DEFAULT_AROUND, ge=0, le=MAX_SLICE),
    completion: int = Query(DEFAULT_COMPLETION, ge=0, le=MAX_SLICE),
) -> Response:
    """The session summary and one digest per recorded call, in call order."""
    ctx: RecorderContext = request.app.state.ctx
    entries = await _records(request, session_id)
    session = ctx.sessions.get(session_id)
    if entries is None or session is None:
        return _not_found(f"no session {session_id!r}")
    options = DigestOptions(messages=messages, tail=tail, around=around, completion=completion)
    calls = await asyncio.to_thread(lambda: [call_digest(e, options) for e in entries])
    verified = await asyncio.to_thread(load_verification, ctx.config.store_path, session_id)
    for call in calls:
        call["verification"] = verified.get(call["call_index"])
    return _json({"session": session.summary(), "calls": calls})


@api_router.get("/sessions/{session_id}/calls/{call_index}/tokens")
async def call_tokens(
    session_id: str,
    call_index: int,
    request: Request,
    part: str = Query(..., pattern="^(prompt|completion)$"),
    start: int = Query(..., ge=0),
    stop: int = Query(..., ge=1),
) -> Response:
    """Ids ``[start, stop)`` of one call's prompt or completion (what the page's expanders load)."""
    entries = await _records(request, session_id)
    if entries is None:
        return _not_found(f"no session {session_id!r}")
    entry = next((e for e in entries if e.get("metadata", {}).get("call_index") == call_index), None)
    if entry is None:
        return _not_found(f"session {session_id!r} has no call {call_index}")
    try:
        piece = token_slice(entry, part, start, stop)  # type: ignore[arg-type]
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return _json(piece)


@api_router.get("/sessions/{session_id}/assembly")
async def session_assembly(session_id: str, request: Request) -> Response:
    """Per-strategy trainable-token ratios and transition counts from the trainer-side assembler."""
    entries = await _records(request, session_id)
    if entries is None:
        return _not_found(f"no session {session_id!r}")
    try:
        stats = await asyncio.to_thread(strategy_stats, entries)
    except StrategyStatsError as exc:
        raise HTTPException(status_code=422, detail=f"records cannot be assembled: {exc}") from None
    return _json(stats)
