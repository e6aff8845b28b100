"""Calls that reach an engine somebody else paused: held and sent again, bounded, never a failure.

Why: a trainer that pauses vLLM directly (not through the recorder's fence, ``fence.py``) makes
vLLM 0.33 and later refuse every new request with a retryable 503 until it resumes ("Generation is
paused. Please retry after it resumes."; vLLM 0.32 held them instead). Handed to the agent, each
refusal is an engine error in the middle of a rollout. The engine ran nothing for a refused request
(it was rejected on arrival), so sending it again is safe: the call waits, as it would at the
recorder's own fence, for at most ``pause_wait_s``, and its record says how long and how often
(``metadata.engine_paused``). A refusal that outlasts the bound is relayed and recorded as it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openenv_harness.recorder.prompt_modes.base import Sampled
from openenv_harness.recorder.upstream.base import UpstreamReply

#: what vLLM 0.33's refusal says (``vllm/v1/engine/core.py``, ``_reject_add_while_paused``)
PAUSED_MARKER = b"generation is paused"
FIRST_DELAY_S, MAX_DELAY_S = 0.05, 1.0


def refused_while_paused(reply: UpstreamReply) -> bool:
    """A 503 whose error says the engine is paused (any other 503 is the engine's own failure)."""
    return reply.status == 503 and PAUSED_MARKER in (reply.body or b"").lower()


async def send_through_pause(send: Callable[[], Awaitable[Sampled]], wait_s: float,
                             note: Callable[[dict[str, Any]], None]) -> Sampled:
    """``send()``, sent again while the engine refuses it as paused, with a growing delay, until
    ``wait_s`` has passed; ``note`` gets what the wait was, when there was one."""
    sampled = await send()
    reply = sampled.reply
    if reply.status != 503 or not refused_while_paused(reply):  # the usual answer, or the engine's own failure
        return sampled
    started = time.monotonic()
    delay, retries = FIRST_DELAY_S, 0
    while refused_while_paused(sampled.reply) and time.monotonic() - started + delay <= wait_s:
        await asyncio.sleep(delay)
        delay = min(MAX_DELAY_S, delay * 2)
        retries += 1
        sampled = await send()
    note({"retries": retries, "waited_s": round(time.monotonic() - started, 3),
          "resumed": not refused_while_paused(sampled.reply)})
    return sampled
