"""The steps before the engine: who calls, what they sent, and whether the session may serve it.

    authenticate → enter → parse → enforce_budget → dedupe

Each step is a function of the ``Flow``. A refusal is an ``AgentError`` raised for the pipeline's funnel;
nothing here asks the engine, so nothing here is recorded.

- ``authenticate``: the bearer key is the session secret (D5). Unknown, missing or another session's
  key → 401.
- ``enter``: the agent's request becomes the chat request the steps run on, through its dialect.
- ``parse``: what a chat body must be for the recorder to forward and store it unchanged -- bounded
  nesting and exact integers (``edge/request_body.check_body``), a non-empty message list of
  role-bearing objects, one sample per call, a tools array, a boolean ``stream``. The call's digest
  names it for retry de-duplication, and its kind is read from the body: an agent call (a policy
  sample of the main loop) or an auxiliary one (a title, a summary), by the session's rules
  (``recorder/classify.py``).
- ``enforce_budget``: the session's caps (``session/budget.py`` says what each counts). The agent is
  answered with a 400 -- the supported CLIs end promptly on one, with no retry storm -- and nothing
  synthetic is recorded as a policy sample.
- ``dedupe``: a retried call (identical body in the same session) is answered from the record. The
  CLIs resend byte-identical bodies on retry; sampling again would put a second, different answer in
  the trace for one agent turn. A replay is exactly what the first attempt was sent -- from its
  in-flight twin, or from the stored record's ``response``, which keeps the logprobs when the call
  asked for them -- so a retry under the same ``Idempotency-Key`` whose body differs gets the logical
  call's one answer too.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping

from openenv_harness.recorder.auth import bearer_token, digests_match, secret_digest
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.classify import classify_call
from openenv_harness.recorder.edge.request_body import check_body
from openenv_harness.recorder.errors import AgentError, body_too_large, session_closed
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.registry import SessionRegistry


def authenticate(sessions: SessionRegistry, path_session: str | None, headers: Mapping[str, str]) -> LiveSession:
    """The session a call's key opens: the path's session when it names one, else the key's own."""
    key = bearer_token(headers)
    if not key:
        raise AgentError(401, "missing API key: send the session secret as a Bearer token", type="authentication_error")
    if path_session is not None:
        session = sessions.get(path_session)
        if session is None or not digests_match(session.secret_digest, key):
            raise AgentError(401, "invalid API key for this session", type="authentication_error")
    else:
        session = sessions.by_digest(secret_digest(key))
        if session is None:
            raise AgentError(401, "invalid API key", type="authentication_error")
    if session.status == "closed" or session.closing:
        raise session_closed(session.id)
    return session


def enter(flow: Flow) -> None:
    entered = flow.dialect.enter(flow.raw, flow.session.dialect_memory)
    flow.body, flow.raw, flow.dialect_call = entered.body, entered.raw, entered.call


def parse(flow: Flow) -> None:
    limit = flow.ctx.config.max_body_bytes
    if len(flow.raw) > limit:  # a dialect's chat translation may be larger than what the agent sent
        raise body_too_large(limit)
    body = flow.body
    check_body(body, flow.raw, flow.ctx.config.max_json_depth)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise AgentError(400, "'messages' must be a non-empty array", code="invalid_messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise AgentError(400, "every message must be an object with a string 'role'", code="invalid_messages")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):  # not True, not 1.0: the integer one, or absent
        raise AgentError(400, "only n=1 is supported (one sample per call)", code="invalid_n")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise AgentError(400, "'tools' must be an array", code="invalid_tools")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise AgentError(400, "'stream' must be a boolean", code="invalid_stream")
    flow.wants_stream = stream
    options = body.get("stream_options")
    flow.include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    flow.keep_logprobs = body.get("logprobs") is True
    # An Idempotency-Key names the logical call even if a client re-encodes its body on retry.
    idem = flow.headers.get("idempotency-key")
    flow.digest = ("idem:" + hashlib.sha256(idem.encode()).hexdigest()) if idem else hashlib.sha256(flow.raw).hexdigest()
    flow.call_kind, flow.aux_rule = classify_call(body, flow.session.spec.aux_rules)


def enforce_budget(flow: Flow) -> None:
    """A stopped session, or a call that would pass one of its caps, is refused (and the cap stops it)."""
    session = flow.session
    if session.status == "stopped":
        flow.ctx.metrics.rejected.labels("stopped").inc()
        raise AgentError(400, f"rollout budget exhausted ({session.stop_reason}); stop now", code="budget_exhausted")
    cap = session.ledger.exceeded(flow.call_kind, time.time() - session.created_at)
    if cap is not None:
        flow.stop = cap  # the pipeline stops the session before the refusal is answered
        flow.ctx.metrics.budget_stops.labels(cap).inc()
        flow.ctx.metrics.rejected.labels("budget").inc()
        raise AgentError(400, f"rollout budget exhausted ({cap}); stop now", code="budget_exhausted")


async def dedupe(flow: Flow) -> bool:
    """Whether the call was answered from its twin or its record (``flow.agent_reply``)."""
    session = flow.session
    first = session.replay.first_attempt(flow.digest)
    if isinstance(first, asyncio.Future):  # still in flight: its reply is this retry's too
        try:
            flow.agent_reply = await asyncio.shield(first)
        except Exception:
            return False  # the twin failed: this retry gets a fresh attempt
        flow.replayed = flow.agent_reply is not None
        return flow.replayed
    if first is not None and flow.ctx.config.dedupe_window:  # a recent record of it
        entry = await flow.ctx.store.find_by_digest(session.id, flow.digest)
        if entry is not None:
            flow.agent_reply = entry["response"]
            flow.replayed = True
            return True
    return False
