"""Flows for step tests: a recorder's parts in memory, a session, one call built by hand.

Each step of a call is a function of the flow (``recorder/call/``). A step test builds the flow the
step expects and runs that step alone; what the step reaches through the flow is real recorder
code -- the session registry, the fence, the metrics, the engine watch -- except two things that
would need a disk or a server: the store is ``MemoryStore`` (held to ``SQLiteStore`` by its own
test) and the engine is the trainer-sampler upstream (``ModelStepUpstream``, product code) over a
scripted ``ModelStep`` (``model_step.py``). No app, no loopback, no files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from openenv_harness.recorder.auth import AdminAuth, new_admin_token
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.dialects.routes import CHAT
from openenv_harness.recorder.engine_knowledge.engine_watch import EngineWatch
from openenv_harness.recorder.fence import Fence
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.metrics import RecorderMetrics
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.recorder.session.registry import SessionRegistry
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.recorder.upstream.model_step import ModelStepUpstream
from openenv_harness.recorder.upstream.span_budget import SpanBudget
from openenv_harness.testing.memory_store import MemoryStore

#: a one-message chat request
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def tcontext(*, upstream: Upstream | None = None, model_step: Callable[..., Any] | None = None,
             **config: Any) -> RecorderContext:
    """A recorder's parts without its server: an open ``MemoryStore``, and as its default engine
    ``upstream``, else ``model_step`` behind ``ModelStepUpstream`` (none: a call that reaches the
    engine fails as an unreachable one would)."""
    settings = RecorderConfig(**{"store_path": "(in memory)", "probe_template": False, "probe_logprobs_mode": False,
                                 **config})
    store = MemoryStore()
    store.open()
    span_budget = SpanBudget(int(settings.prompt_cache_mb * (1 << 20)))
    token = new_admin_token()
    if upstream is None:
        upstream = ModelStepUpstream(model_step or _no_engine)
    return RecorderContext(
        config=settings, store=store, sessions=SessionRegistry(store, span_budget),
        fence=Fence(wait_s=settings.pause_wait_s), upstreams={"default": upstream}, metrics=RecorderMetrics(),
        admin_token=token, admin_auth=AdminAuth(token),
        engine_watch=EngineWatch({}, ttl_s=settings.template_reprobe_s, probe_template=False,
                                 probe_logprobs_mode=False),
        span_budget=span_budget,
    )


async def tsession(ctx: RecorderContext, spec: SessionSpec | None = None) -> tuple[LiveSession, str]:
    """A session created and persisted as the admin route does it; its secret for the agent's key."""
    session, secret = ctx.sessions.new(spec or SessionSpec())
    await ctx.sessions.add(session)
    return session, secret


def tflow(ctx: RecorderContext, session: LiveSession, body: dict[str, Any] | bytes | None = None, *,
          dialect: Dialect = CHAT, headers: dict[str, str] | None = None) -> Flow:
    """One call of ``session`` as the pipeline builds it after authentication."""
    raw = body if isinstance(body, bytes) else orjson.dumps(BODY if body is None else body)
    return Flow(ctx=ctx, session=session, headers=headers or {}, dialect=dialect, raw=raw)


def answered(flow: Flow, *, content: str = "", tool_calls: list[dict[str, Any]] | None = None,
             prompt: list[int] | None = None, completion: list[int] | None = None,
             finish_reason: str | None = None, status: int = 200) -> Flow:
    """``flow`` as the engine answered it: a vLLM chat reply (top-level ``prompt_token_ids``,
    ``choices[0].token_ids`` and ``token_id:N`` logprobs), the shape ``reply_from_step`` and the
    HTTP engines produce."""
    prompt = [1, 2, 3] if prompt is None else prompt
    completion = [7, 8] if completion is None else completion
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    reply = {
        "id": "chatcmpl-t", "object": "chat.completion", "model": "m", "prompt_token_ids": prompt,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                     "token_ids": completion,
                     "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.25 * (i + 1)}
                                              for i, t in enumerate(completion)]}}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                  "total_tokens": len(prompt) + len(completion)},
    }
    flow.engine_asked = True
    flow.reply = UpstreamReply(status=status, json=reply)
    return flow


def tool_calls(n: int) -> list[dict[str, Any]]:
    """``n`` bash tool calls as a chat reply carries them."""
    return [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"i": {i}}}'}}
            for i in range(n)]


def _no_engine(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
    raise ConnectionError("no engine in this test")
