"""``DialerThread``: the dialer for synchronous callers, on its own loop and thread."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from relay_support import StartRelay, Target

from openenv_harness.relay import DialerThread, RelayDialer, RelayUnavailableError


async def test_a_thread_runs_the_dialer_while_the_caller_blocks(start_relay: StartRelay, target: Target) -> None:
    relay = await start_relay()
    runner = DialerThread(lambda: RelayDialer(relay.ws_url, dict, target.url,
                                              allowed_path_prefixes=["/echo"]))
    await asyncio.to_thread(runner.start)
    try:
        await asyncio.to_thread(runner.wait_connected, 10)
        assert any(t.name == "relay-dialer" for t in threading.enumerate())
        async with httpx.AsyncClient(timeout=20) as client:
            assert (await client.post(f"{relay.base}/echo", content=b"sync")).content == b"sync"
            assert (await client.get(f"{relay.base}/headers")).status_code == 403
            runner.allow_path_prefix("/headers")
            await asyncio.sleep(0.05)
            assert (await client.get(f"{relay.base}/headers")).status_code == 200
        # The agent's side can read the reply before the dialer's thread resumes from its last
        # send and counts the call, so give that thread a moment rather than racing it.
        for _ in range(200):
            if runner.stats.calls_completed == 2:
                break
            await asyncio.sleep(0.01)
        assert runner.stats.calls_completed == 2
        assert runner.stats.calls_failed == 1, "the forbidden path counts as a failed call"
    finally:
        await asyncio.to_thread(runner.stop)
    assert not any(t.name == "relay-dialer" for t in threading.enumerate()), "stop() joins the thread"
    await asyncio.to_thread(runner.stop)  # twice is fine


def test_wait_connected_times_out_with_a_clear_error() -> None:
    with DialerThread(lambda: RelayDialer(lambda: "ws://127.0.0.1:9/relay", dict, "http://127.0.0.1:9")) as runner:
        with pytest.raises(RelayUnavailableError, match="no relay link after 0.3s"):
            runner.wait_connected(0.3)


def test_using_a_runner_before_start_is_an_error() -> None:
    runner = DialerThread(lambda: RelayDialer(lambda: "ws://x/relay", dict, "http://127.0.0.1:9"))
    with pytest.raises(RuntimeError, match="not started"):
        runner.wait_connected(1)
