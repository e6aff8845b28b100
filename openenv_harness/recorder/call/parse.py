"""Step: what a chat body must be for the recorder to forward and store it unchanged.

The body is decoded once, at entry (``enter.py``); here it is checked: bounded nesting and exact
integers (``request_body.check_body``), a non-empty message list of role-bearing objects, one sample
per call, a tools array, a boolean ``stream``. The call's digest names it for retry de-duplication.
"""

from __future__ import annotations

import hashlib

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.edge.request_body import check_body
from openenv_harness.recorder.errors import AgentError, body_too_large


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
