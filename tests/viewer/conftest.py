"""Viewer test fixtures: a reference engine, a recorder, and real sessions recorded through them.

The sessions are produced the way real ones are: a small agent loop (``viewer_support.drive``)
talks to the recorder over loopback HTTP, the recorder forwards to the reference engine, which
injects the faults asked for.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import pytest
from viewer_support import ADMIN, SYSTEM, TASK, Recorded, drive, tool_script

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault
from openenv_harness.testing.recorder_fixtures import engine_fixture


engine = engine_fixture()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, engine: EngineServer) -> Iterator[Recorded]:
    store = tmp_path_factory.mktemp("viewer") / "records.db"
    config = RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        drift = admin.create_session(harness="pi")
        engine.set_script(drift["session_id"], tool_script(3, spaced_args=True))
        engine.add_fault(drift["session_id"], Fault(status=500, on_turn=2))

        def bump(turn: int) -> None:
            if turn == 3:
                admin.set_policy_version(1)

        drift_statuses = drive(drift, echo="pi", before_turn=bump)
        assert drift_statuses == [200, 200, 500, 200, 200], drift_statuses
        # the agent compacts its history: the next prompt shares only the opening messages (a break)
        compacted = [SYSTEM, TASK, {"role": "user", "content": "Summary so far: steps 0-2 ran. Continue."}]
        drive(drift, echo="pi", messages=compacted, max_turns=1)
        admin.close_session(drift["session_id"])

        faults = admin.create_session(harness="opencode", budgets={"max_agent_calls": 3})
        engine.set_script(faults["session_id"], tool_script(4))
        engine.add_fault(faults["session_id"], Fault(latency_s=1.5, on_turn=0))
        engine.add_fault(faults["session_id"], Fault(status=500, on_turn=1))
        engine.add_fault(faults["session_id"], Fault(logprob_mismatch=True, on_turn=2))
        title = httpx.post(f"{faults['base_url']}/chat/completions", timeout=30,  # a tool-less title call: aux
                           headers={"authorization": f"Bearer {faults['secret']}"},
                           json={"model": "reference-model", "messages": [{"role": "user", "content": "Title?"}]})
        assert title.status_code == 200, title.text
        # the trainer syncs weights while the first agent call is in flight (the engine holds it for
        # 1.5 s once received): that call straddles the sync
        seen = len(engine.requests(faults["session_id"]))

        def sync_once_in_flight() -> None:
            deadline = time.monotonic() + 10
            while len(engine.requests(faults["session_id"])) == seen and time.monotonic() < deadline:
                time.sleep(0.02)
            admin.set_policy_version(2)

        sync = threading.Thread(target=sync_once_in_flight)

        def sync_during_first_call(turn: int) -> None:
            if turn == 0:
                sync.start()

        fault_statuses = drive(faults, echo="opencode", before_turn=sync_during_first_call)
        sync.join()
        assert fault_statuses == [200, 500, 200, 200, 400], fault_statuses
        assert admin.session(faults["session_id"])["stop_reason"] == "max_agent_calls"

        long = admin.create_session()
        engine.set_script(long["session_id"], tool_script(1, spaced_args=True))
        pasted = {"role": "user", "content": " ".join(f"line {i}: value={i * 7 % 1000}" for i in range(2800))}
        assert drive(long, echo="pi", messages=[SYSTEM, pasted]) == [200, 200]

        yield Recorded(url=server.url, admin=admin, drift=drift["session_id"], faults=faults["session_id"],
                       agent_secret=faults["secret"], long=long["session_id"])


@pytest.fixture
def http(recorded: Recorded) -> Iterator[httpx.Client]:
    """An unauthenticated client on the recorder (tests add credentials per request)."""
    with httpx.Client(base_url=recorded.url, timeout=30, follow_redirects=False) as client:
        yield client
