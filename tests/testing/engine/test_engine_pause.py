"""vLLM's dev-mode fence over HTTP, with a request really in flight across the pause."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, Turn

TURN = Turn(content="This reply takes a while to generate, one token at a time.")


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[EngineServer]:
    config = EngineConfig(decode_delay_s=0.02, default_script=Script(turns=[TURN]))
    with EngineServer(config) as server:
        yield server


@pytest.fixture(autouse=True)
def _resumed(slow_engine: EngineServer) -> Iterator[None]:
    yield
    slow_engine.resume()


def _body(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "go"}], "tools": [{"type": "function", "function": {"name": "x"}}],
            "return_token_ids": True, **extra}


async def _chat(client: httpx.AsyncClient, **extra) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=_body(**extra))


async def test_keep_stalls_in_flight_and_new_requests_until_resume(slow_engine: EngineServer) -> None:
    async with httpx.AsyncClient(base_url=slow_engine.url, timeout=30) as client:
        in_flight = asyncio.create_task(_chat(client))
        await asyncio.sleep(0.1)
        assert (await client.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
        assert (await client.get("/is_paused")).json() == {"is_paused": True}
        newcomer = asyncio.create_task(_chat(client))
        await asyncio.sleep(0.5)
        assert not in_flight.done() and not newcomer.done(), "nothing errors, nothing advances"
        assert (await client.post("/resume")).json() == {"status": "resumed"}
        first, second = await asyncio.wait_for(asyncio.gather(in_flight, newcomer), 10)
    for reply in (first, second):
        choice = reply.json()["choices"][0]
        assert reply.status_code == 200 and choice["finish_reason"] == "stop"
        assert choice["message"]["content"] == TURN.content


async def test_keep_stalls_a_stream_mid_generation(slow_engine: EngineServer) -> None:
    seen: list[float] = []

    async def consume(client: httpx.AsyncClient) -> list[str]:
        lines = []
        async with client.stream("POST", "/v1/chat/completions", json=_body(stream=True)) as response:
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                    seen.append(time.monotonic())
        return lines

    async with httpx.AsyncClient(base_url=slow_engine.url, timeout=30) as client:
        task = asyncio.create_task(consume(client))
        await asyncio.sleep(0.1)
        await client.post("/pause", params={"mode": "keep"})
        paused_at = time.monotonic()
        await asyncio.sleep(0.4)
        count_while_paused = len([t for t in seen if t > paused_at + 0.05])
        await client.post("/resume")
        lines = await asyncio.wait_for(task, 10)
    assert count_while_paused == 0
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"stop"' in lines[-2]


async def test_abort_ends_in_flight_requests_and_holds_new_ones(slow_engine: EngineServer) -> None:
    async with httpx.AsyncClient(base_url=slow_engine.url, timeout=30) as client:
        plain = asyncio.create_task(_chat(client))
        streamed = asyncio.create_task(client.post("/v1/chat/completions", json=_body(stream=True)))
        await asyncio.sleep(0.12)
        assert (await client.post("/pause", params={"mode": "abort"})).json() == {"status": "paused"}
        reply = await asyncio.wait_for(plain, 5)
        stream_reply = await asyncio.wait_for(streamed, 5)
        newcomer = asyncio.create_task(_chat(client))
        await asyncio.sleep(0.3)
        assert not newcomer.done()
        await client.post("/resume")
        later = await asyncio.wait_for(newcomer, 10)
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert 0 < len(choice["token_ids"]) < len(later.json()["choices"][0]["token_ids"])
    assert reply.json()["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert '"finish_reason":"abort"' in stream_reply.text and stream_reply.text.endswith("data: [DONE]\n\n")
    assert later.json()["choices"][0]["finish_reason"] == "stop"


async def test_wait_returns_after_in_flight_requests_finish(slow_engine: EngineServer) -> None:
    async with httpx.AsyncClient(base_url=slow_engine.url, timeout=30) as client:
        in_flight = asyncio.create_task(_chat(client))
        await asyncio.sleep(0.1)
        paused = await client.post("/pause", params={"mode": "wait"})
        assert paused.json() == {"status": "paused"}
        assert in_flight.done(), "wait returns only once the in-flight request is done"
        assert in_flight.result().json()["choices"][0]["finish_reason"] == "stop"
        newcomer = asyncio.create_task(_chat(client))
        await asyncio.sleep(0.2)
        assert not newcomer.done()
        await client.post("/resume")
        assert (await asyncio.wait_for(newcomer, 10)).status_code == 200


def test_bad_mode_is_a_400_and_dev_routes_can_be_off(slow_engine: EngineServer) -> None:
    bad = httpx.post(slow_engine.url + "/pause", params={"mode": "later"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.mode"  # vLLM's query validation
    assert slow_engine.is_paused() is False
    with EngineServer(EngineConfig(dev_mode=False)) as engine:
        assert httpx.post(engine.url + "/pause").status_code == 404


async def _stream_until(client: httpx.AsyncClient, body: dict, tokens_before_signal: int,
                        signal: asyncio.Event) -> list[dict]:
    """Read a stream; set ``signal`` once ``tokens_before_signal`` token chunks have arrived."""
    events = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if sum(1 for e in events if e["choices"] and "role" not in e["choices"][0]["delta"]) >= \
                        tokens_before_signal:
                    signal.set()
    return events


async def _until_in_flight(engine: EngineServer) -> None:
    while engine.app.state.engine.fence.in_flight < 1:
        await asyncio.sleep(0.01)


async def test_an_abort_lands_on_the_last_token_and_before_any_token_sends_no_finish() -> None:
    """vLLM 0.32, measured: the abort's finish reason rides on the chunk of the last token sent; a
    request aborted before its first token gets its first chunk, no finish chunk, then usage."""
    config = EngineConfig(decode_delay_s=0.02, prefill_delay_s=3600, default_script=Script(turns=[TURN]))
    with EngineServer(config) as engine:
        async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
            never = asyncio.Event()
            early = asyncio.create_task(_stream_until(client, _body(stream=True, stream_options={
                "include_usage": True}), 1, never))
            await asyncio.wait_for(_until_in_flight(engine), 10)  # admitted, still in its (endless) prefill
            await client.post("/pause", params={"mode": "abort"})
            events = await asyncio.wait_for(early, 10)
            await client.post("/resume")
        assert [bool(e["choices"]) for e in events] == [True, False] and events[1]["usage"]["completion_tokens"] == 0
        assert not never.is_set()
    config = EngineConfig(decode_delay_s=0.05, default_script=Script(turns=[TURN]))
    with EngineServer(config) as engine:
        async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
            two_tokens = asyncio.Event()
            late = asyncio.create_task(_stream_until(client, _body(stream=True), 2, two_tokens))
            await asyncio.wait_for(two_tokens.wait(), 10)
            await client.post("/pause", params={"mode": "abort"})
            events = await asyncio.wait_for(late, 10)
            await client.post("/resume")
        last = events[-1]["choices"][0]
        assert last["finish_reason"] == "abort" and len(last["token_ids"]) == 1
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
        assert 2 < len(events) - 1 < len(TURN.content)  # cut short, not finished
