"""What the viewer tests share: the admin token, a small agent loop, the recorded sessions' shape,
and viewer logins.

The sessions are produced the way real ones are: a small agent loop (tools, echoed history, tool
results, retry on 5xx like the real CLIs, stop on a 400) talks to the recorder over loopback HTTP,
the recorder forwards to the reference engine, which injects the faults asked for. Kept out of
``conftest.py`` (which holds the fixtures) so test modules import it by a name unique across
``tests/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import httpx

from openenv_harness.recorder import RecorderClient
from openenv_harness.testing.engine import Script, ToolCallSpec, Turn, agent_echo

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
