"""An engine paused by someone else (vLLM 0.33+ semantics: new requests refused with a retryable 503
until it resumes): the recorder holds the agent's call and sends it again, bounded, and records how
long it waited -- the agent never sees an engine failure for a pause it cannot know about."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[EngineServer, RecorderClient]]:
    wait_s = getattr(request, "param", 30.0)
    engine = EngineServer(EngineConfig(pause_rejects_new=True)).start()
    server = RecorderServer(RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url,
                                           admin_token=ADMIN, pause_wait_s=wait_s)).start()
    client = RecorderClient(server.url, ADMIN)
    try:
        yield engine, client
    finally:
        client.close()
        server.stop()
        engine.stop()


def _chat(session: dict) -> httpx.Response:
    return httpx.post(f"{session['base_url']}/chat/completions", timeout=120,
                      headers={"authorization": f"Bearer {session['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]})


def _chat_requests(engine: EngineServer) -> int:
    return sum(1 for r in engine.requests() if r.get("path") == "/v1/chat/completions")


def test_a_call_refused_by_a_paused_engine_is_held_until_it_resumes(stack) -> None:
    engine, admin = stack
    session = admin.create_session()
    engine.pause("abort")  # the trainer pauses vLLM itself, not through the recorder's fence
    refused = httpx.post(f"{engine.url}/v1/chat/completions", json={"model": "reference-model",
                         "messages": [{"role": "user", "content": "direct"}]})
    assert refused.status_code == 503 and "Generation is paused" in refused.text, "vLLM 0.33's refusal"
    before = _chat_requests(engine)
    result: dict = {}
    caller = threading.Thread(target=lambda: result.setdefault("reply", _chat(session)))
    caller.start()
    deadline = time.monotonic() + 60
    while _chat_requests(engine) < before + 2 and time.monotonic() < deadline:  # refused, and sent again
        time.sleep(0.02)
    assert _chat_requests(engine) >= before + 2
    assert caller.is_alive(), "the agent is still waiting, not handed the engine's 503"
    engine.resume()
    caller.join(60)
    assert result["reply"].status_code == 200, result["reply"].text
    [record] = admin.records(session["session_id"])
    md = record["metadata"]
    assert md["status"] == "ok" and md["engine_paused"]["resumed"] is True
    assert md["engine_paused"]["retries"] >= 1 and md["engine_paused"]["waited_s"] > 0


@pytest.mark.parametrize("stack", [0.3], indirect=True)
def test_a_pause_that_outlasts_the_bound_is_relayed_retryable_and_recorded(stack) -> None:
    engine, admin = stack
    session = admin.create_session()
    engine.pause("wait")
    try:
        reply = _chat(session)
    finally:
        engine.resume()
    assert reply.status_code == 503, "still retryable for the agent"
    [record] = admin.records(session["session_id"])
    md = record["metadata"]
    assert md["status"] == "failed" and md["engine_paused"]["resumed"] is False
    assert md["engine_paused"]["retries"] >= 1
    assert _chat(session).status_code == 200, "once resumed, the agent's retry goes through"


def test_a_call_that_was_not_refused_says_nothing_of_pauses(stack) -> None:
    engine, admin = stack
    session = admin.create_session()
    assert _chat(session).status_code == 200
    assert "engine_paused" not in admin.records(session["session_id"])[0]["metadata"]


@pytest.mark.parametrize("status, body", [(200, b"{}"), (503, b'{"error": "out of memory"}')])
async def test_a_reply_that_is_no_pause_refusal_is_sent_once_and_noted_nowhere(status: int, body: bytes) -> None:
    """The engine's own 503 is its failure, relayed as it is: no retry, no ``metadata.engine_paused``."""
    from openenv_harness.recorder.engine_paused import send_through_pause
    from openenv_harness.recorder.prompt_modes.base import Sampled
    from openenv_harness.recorder.upstream.base import UpstreamReply

    sent: list[int] = []
    notes: list[dict] = []

    async def send() -> Sampled:
        sent.append(1)
        return Sampled(UpstreamReply(status=status, json=None, body=body))

    sampled = await send_through_pause(send, 5.0, notes.append)
    assert sampled.reply.status == status and sent == [1] and notes == []


async def test_a_pause_refusal_is_sent_again_and_noted() -> None:
    """The check above can fail: a paused engine's refusal is retried and the wait is noted."""
    from openenv_harness.recorder.engine_paused import send_through_pause
    from openenv_harness.recorder.prompt_modes.base import Sampled
    from openenv_harness.recorder.upstream.base import UpstreamReply

    replies = [UpstreamReply(status=503, json=None, body=b'{"error": "Generation is paused."}'),
               UpstreamReply(status=200, json=None, body=b"{}")]
    notes: list[dict] = []

    async def send() -> Sampled:
        return Sampled(replies.pop(0))

    sampled = await send_through_pause(send, 5.0, notes.append)
    assert sampled.reply.status == 200 and notes[0]["retries"] == 1 and notes[0]["resumed"] is True
