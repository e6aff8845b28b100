"""Viewer test fixtures: a reference engine, a recorder, and real sessions recorded through them.

The sessions are produced the way real ones are: a small agent loop (tools, echoed history, tool
results, retry on 5xx like the real CLIs, stop on a 400) talks to the recorder over loopback HTTP,
the recorder forwards to the reference engine, which injects the faults asked for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn, agent_echo

ADMIN = "viewer-admin-token-0123456789abcdef"
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "Do the task step by step."}
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
ENGINE_ERROR = "Injected 500 Internal Server Error"


def tool_script(n_tool_turns: int, *, spaced_args: bool = False) -> Script:
    """``n_tool_turns`` bash calls then a final answer. ``spaced_args`` samples odd spacing that neither
    the agent's compact replay nor the engine's re-rendering of it (vLLM parses replayed arguments)
    gives back: drift."""
    turns = []
    for i in range(n_tool_turns):
        args: Any = '{"command":  "echo step %d"}' % i if spaced_args else {"command": f"echo step {i}"}
        turns.append(Turn(content=f"Running step {i}.", tool_calls=[ToolCallSpec(name="bash", arguments=args)]))
    turns.append(Turn(content="All done."))
    return Script(turns=turns)


def drive(session: dict[str, Any], *, echo: str, max_turns: int = 12,
          before_turn: Callable[[int], None] | None = None,
          messages: list[dict[str, Any]] | None = None) -> list[int]:
    """Run an agent loop; returns every HTTP status it got (a 5xx is retried once, a 400 ends it)."""
    history = list(messages or [SYSTEM, TASK])
    statuses: list[int] = []
    headers = {"authorization": f"Bearer {session['secret']}"}
    with httpx.Client(timeout=60) as http:
        for turn in range(max_turns):
            if before_turn is not None:
                before_turn(turn)
            body = {"model": "reference-model", "messages": history, "tools": TOOLS, "max_tokens": 256}
            for _ in range(2):
                reply = http.post(f"{session['base_url']}/chat/completions", json=body, headers=headers)
                statuses.append(reply.status_code)
                if reply.status_code < 500:
                    break
            if reply.status_code != 200:
                return statuses
            message = reply.json()["choices"][0]["message"]
            if not message.get("tool_calls"):
                return statuses
            history.append(agent_echo(message, echo))  # type: ignore[arg-type]
            for call in message["tool_calls"]:
                result = f"ran {call['function']['name']}\n"
                history.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return statuses


@dataclass
class Recorded:
    """The recorder under test, its admin client, and the sessions recorded through it."""

    url: str
    admin: RecorderClient
    #: exact-free chain with replay drift, a failed call, a policy-version bump, then a break; closed.
    drift: str
    #: an aux call, a call straddling a weight sync, a failed call, an invalid (untrainable) call,
    #: then stopped by its agent-call budget.
    faults: str
    #: the secret of the ``faults`` session (an agent key, which must not open the viewer).
    agent_secret: str
    #: two calls whose prompts hold ~27k ids each (a long pasted input), the second drifting.
    long: str


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with EngineServer() as e:
        yield e


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


def login_cookie(http: httpx.Client) -> str:
    """Log in through the viewer's form and return the cookie value it set."""
    reply = http.post("/viewer/login", data={"token": ADMIN})
    assert reply.status_code == 303, reply.text
    value = reply.cookies.get("oeh_admin")
    assert value, reply.headers
    http.cookies.clear()  # callers pass the cookie explicitly: the client stays unauthenticated
    return value


def login_code(recorded: Recorded) -> str:
    """A one-time viewer login code, minted with the admin token over the control plane."""
    reply = httpx.post(f"{recorded.url}/admin/viewer/codes", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert reply.status_code == 201, reply.text
    return str(reply.json()["code"])
