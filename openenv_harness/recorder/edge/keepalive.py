"""Keep a streaming agent's connection alive while its call is still with the engine.

Why: the recorder replies only once the record is durable, so a streaming agent hears nothing for
the whole time the engine prefills and samples. On a CPU engine, or a long answer on any engine,
that is minutes, and the CLIs give up on a silent stream (Claude Code after 5 minutes: "No data
arrived"; Codex's stream idle timeout; proxies in between sooner). Real APIs send keepalive events
for exactly this; so do we -- without giving up durability before the reply:

- a call that finishes within ``grace_s`` is answered as if no keepalive existed (its status, its headers);
- a streaming call still running after ``grace_s`` is committed to ``200 text/event-stream``: the
  agent gets the dialect's keepalive event (Anthropic ``ping``; an SSE comment for Chat Completions
  and Responses, which every SSE parser skips) every ``interval_s``, and then the reply's events,
  whose terminal event still comes only after the record committed. An error after that point goes
  out as the dialect's in-stream error event (the status is sent already), carrying the same message.

A non-streaming call is never changed: it has no way to carry keepalives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

if TYPE_CHECKING:
    from openenv_harness.recorder.dialects.base import Dialect

class KeepaliveStream(StreamingResponse):
    """A reply committed to 200 before its call finished; its body waits on the call."""

    keepalive_stream = True  # what the recorder's own HTTP protocol looks for to write it chunked


async def answer(task: asyncio.Future[Response], *, streaming: Callable[[], bool], dialect: Dialect,
                 grace_s: float, interval_s: float) -> Response:
    """``task``'s response, or -- for a streaming call still running after ``grace_s`` -- a stream
    that carries keepalives until it is done. ``streaming`` says whether the call asked to stream
    (known once its body is parsed, long before the grace ends)."""
    try:
        return await asyncio.wait_for(asyncio.shield(task), grace_s)
    except TimeoutError:
        pass
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not streaming():
        return await task
    return KeepaliveStream(_events(task, dialect, interval_s), media_type="text/event-stream",
                           headers={"cache-control": "no-cache"})


async def _events(task: asyncio.Future[Response], dialect: Dialect, interval_s: float) -> AsyncIterator[bytes]:
    ping = dialect.keepalive_event
    while True:
        done, _ = await asyncio.wait({task}, timeout=interval_s)
        if done:
            break
        yield ping
    response = task.result()  # the call's own steps turned every failure into a response
    if response.status_code == 200 and response.media_type == "text/event-stream":
        yield bytes(response.body)
    else:
        yield dialect.stream_error(response)


def keepalive_body(response: Any) -> AsyncIterator[bytes] | None:
    """The body iterator of a ``KeepaliveStream`` (None for any other response)."""
    return response.body_iterator if getattr(response, "keepalive_stream", False) else None
