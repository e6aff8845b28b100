"""Call numbers (``call_index``) are the positions of a session's records: 0, 1, 2, ... with no gap.

A number is given to a call when its record is built -- never to a call refused before the engine,
and never kept by a call whose record could not be stored (the number goes back) -- and a call
that fails inside the recorder after the engine may have been called is recorded as failed.
Budgets count what the records show (``session/budget.py``)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.recorder.store.journal import JournalError
from openenv_harness.testing.engine import EngineServer

from agentloop import TOOLS, tool_script

_CALLS = itertools.count()


def call() -> dict[str, Any]:
    """A fresh agent call (never byte-identical to an earlier one: that would be a replayed retry)."""
    return {"model": "reference-model", "messages": [{"role": "user", "content": f"go {next(_CALLS)}"}], "tools": TOOLS}


def post(s: dict[str, Any], body: Any = None, **kwargs: Any) -> httpx.Response:
    if body is None and "content" not in kwargs:
        body = call()
    return httpx.post(f"{s['base_url']}/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {s['secret']}"}, **kwargs)


def indexes(admin: RecorderClient, s: dict[str, Any]) -> list[int]:
    return [r["metadata"]["call_index"] for r in admin.records(s["session_id"])]


def test_refused_and_unstorable_calls_use_no_number(recorder: RecorderServer, admin: RecorderClient,
                                                    engine: EngineServer, monkeypatch: pytest.MonkeyPatch) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(4))
    assert post(s).status_code == 200
    # refused before the engine: bad JSON, too deep, out-of-range integer, bad n
    for raw in (b"{", b'{"messages":' + b"[" * 100 + b"]" * 100 + b"}",
                b'{"messages":[{"role":"user","content":"x"}],"seed":99999999999999999999999}',
                b'{"messages":[{"role":"user","content":"x"}],"n":true}'):
        assert post(s, content=raw).status_code == 400
    # the engine answered but the record could not be stored: 503, and the number goes back
    journal = recorder.ctx.store.journal
    real_append = journal.append

    def disk_full(seq: int, parts: list[bytes]) -> None:
        raise JournalError("cannot write the record journal: [Errno 28] No space left on device")

    monkeypatch.setattr(journal, "append", disk_full)
    assert post(s).status_code == 503
    monkeypatch.setattr(journal, "append", real_append)
    assert post(s).status_code == 200
    assert indexes(admin, s) == [0, 1]
    records = admin.records(s["session_id"])
    assert records[-1]["metadata"]["limits"]["calls"] == 2, "the unstored call counts against no budget"


def test_a_failure_inside_the_recorder_is_recorded_with_its_number(
        recorder: RecorderServer, admin: RecorderClient, engine: EngineServer, monkeypatch: pytest.MonkeyPatch) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(4))
    assert post(s).status_code == 200
    upstream = recorder.ctx.upstream_for(None)
    assert upstream is not None
    real_chat = upstream.chat

    async def broken(body: dict[str, Any], *, session_id: str) -> Any:
        raise RuntimeError("a bug in the upstream client")

    monkeypatch.setattr(upstream, "chat", broken)
    r = post(s)
    assert r.status_code == 500 and r.json()["error"]["code"] == "recorder_error"
    assert "bug in the upstream client" not in r.text  # the agent is told what, not the recorder's internals
    monkeypatch.setattr(upstream, "chat", real_chat)
    assert post(s).status_code == 200
    records = admin.records(s["session_id"])
    assert indexes(admin, s) == [0, 1, 2]
    assert [r["metadata"]["status"] for r in records] == ["ok", "failed", "ok"]
    assert records[1]["metadata"]["error"]["kind"] == "recorder_error"
    assert records[1]["metadata"]["trainable"] is False
