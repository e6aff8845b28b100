"""The generated malformed-request corpus (``malformed.py``) against real recorders over loopback.

Every case must get what it expects -- a 4xx (with the recorder's error code where the refusal is
its own) or, for framing that ends before a request does, a clean close -- and never a 5xx or a
hang. Then the recorders must still be healthy, the only records must be the calls the engine
itself refused (as failed records) and one good call, and their call numbers must have no gap.
The counts by outcome are printed (``-s``) and, with ``OEH_CORPUS_REPORT=path``, written as JSON.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.serving import ThreadedServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, tool_script
from malformed import CLOSE, Case, Target, build_corpus
from rawhttp import Outcome, exchange

LIMITS: dict[str, Any] = {"max_header_bytes": 8192, "max_header_count": 32, "max_body_bytes": 64 * 1024}


def _target(server: RecorderServer, session: dict[str, Any]) -> Target:
    path = "/" + session["base_url"].split("://", 1)[1].split("/", 1)[1] + "/chat/completions"
    return Target(chat_path=path, secret=session["secret"], admin_token=ADMIN,
                  max_header_bytes=LIMITS["max_header_bytes"], max_header_count=LIMITS["max_header_count"],
                  max_body_bytes=LIMITS["max_body_bytes"], max_json_depth=server.config.max_json_depth)


def _verdict(case: Case, out: Outcome) -> str | None:
    """None when ``out`` is what ``case`` may get, else what is wrong."""
    if CLOSE in case.expect:
        return None if out.closed and not out.replies else f"expected a close, got {out.statuses} closed={out.closed}"
    if len(out.replies) != case.replies:
        return f"expected {case.replies} replies, got {out.statuses} (closed={out.closed}, leftover={out.leftover[:80]!r})"
    for reply in out.replies:
        if reply.status not in case.expect or not 400 <= reply.status < 500:
            return f"expected {sorted(case.expect)}, got {out.statuses}: {reply.body[:200]!r}"
    if case.code is not None:
        try:
            code = orjson.loads(out.replies[0].body)["error"]["code"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return f"expected a JSON error with code {case.code}, got {out.replies[0].body[:200]!r}"
        if code != case.code:
            return f"expected code {case.code}, got {code}: {out.replies[0].body[:200]!r}"
    return None


def _run(server: ThreadedServer, case: Case) -> tuple[Case, Outcome]:
    return case, exchange(server.host, server.port, case.pieces, replies=case.replies, half_close=case.half_close,
                          until_closed=CLOSE in case.expect, bodiless=case.bodiless)


def _outcome(out: Outcome) -> str:
    return "+".join(map(str, out.statuses)) if out.replies else ("reset" if out.reset else "close")


def test_a_thousand_malformed_requests(tmp_path: Path, engine: EngineServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    main = RecorderConfig(store_path=str(tmp_path / "main.db"), engine_url=engine.url, admin_token=ADMIN, **LIMITS)
    impatient = RecorderConfig(store_path=str(tmp_path / "slow.db"), engine_url=engine.url, admin_token=ADMIN,
                               request_head_timeout_s=2.0, request_body_timeout_s=2.0, **LIMITS)
    with RecorderServer(main) as server, RecorderServer(impatient) as slow_server, \
            RecorderClient(server.url, ADMIN) as admin, RecorderClient(slow_server.url, ADMIN) as slow_admin:
        session, slow_session = admin.create_session(), slow_admin.create_session()
        for s in (session, slow_session):
            engine.set_script(s["session_id"], tool_script(0, final="fine"))
        cases = [c for c in build_corpus(_target(server, session)) if not c.slow]
        slow = [c for c in build_corpus(_target(slow_server, slow_session)) if c.slow]
        assert len(cases) + len(slow) >= 1000
        jobs = [(server, c) for c in cases] + [(slow_server, c) for c in slow]
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda job: _run(*job), jobs))

        wrong = [f"{case.family}: {case.name}: {problem}" for case, out in results
                 if (problem := _verdict(case, out)) is not None]
        tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for case, out in results:
            tally[case.family][_outcome(out)] += 1
            tally["all"][_outcome(out)] += 1
        report = {family: dict(sorted(counts.items())) for family, counts in sorted(tally.items())}
        print(f"\nmalformed corpus: {len(results)} requests")
        for family, counts in report.items():
            print(f"  {family:8} {sum(counts.values()):5}  " + "  ".join(f"{k}: {v}" for k, v in counts.items()))
        if os.environ.get("OEH_CORPUS_REPORT"):
            Path(os.environ["OEH_CORPUS_REPORT"]).write_text(json.dumps(report, indent=2) + "\n")
        assert not wrong, f"{len(wrong)} of {len(results)} cases got something else:\n" + "\n".join(wrong[:40])

        # still healthy, and nothing recorded but what the engine refused, with no gap in the numbers
        for s, base in ((session, server.url), (slow_session, slow_server.url)):
            assert httpx.get(base + "/healthz", timeout=30).status_code == 200
            good = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                              json={"model": "reference-model", "messages": [{"role": "user", "content": "ok?"}]},
                              timeout=30)
            assert good.status_code == 200, good.text
        rejected = sum(c.engine_rejects for c in cases)
        records = admin.records(session["session_id"])
        assert [r["metadata"]["status"] for r in records] == ["failed"] * rejected + ["ok"]
        assert all(r["metadata"]["error"]["upstream_status"] == 400 for r in records[:-1])
        assert [r["metadata"]["call_index"] for r in records] == list(range(rejected + 1))
        assert len(engine.requests(session["session_id"])) == rejected + 1
        assert [r["metadata"]["call_index"] for r in slow_admin.records(slow_session["session_id"])] == [0]
        assert admin.session(session["session_id"])["status"] == "open"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors[:5]]


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_body_corpus_on_the_asgi_path(http: str, tmp_path: Path, engine: EngineServer) -> None:
    """The same bad bodies through the recorder app under uvicorn's own protocols (any ASGI server):
    the same answers, the same codes, the same records."""
    config = RecorderConfig(store_path=str(tmp_path / "asgi.db"), engine_url=engine.url, admin_token=ADMIN, **LIMITS)
    with ThreadedServer(create_recorder_app(config), http=http) as server, RecorderClient(server.url, ADMIN) as admin:
        session = admin.create_session()
        engine.set_script(session["session_id"], tool_script(0, final="fine"))
        path = "/" + session["base_url"].split("://", 1)[1].split("/", 1)[1] + "/chat/completions"
        target = Target(chat_path=path, secret=session["secret"], admin_token=ADMIN, max_json_depth=config.max_json_depth,
                        max_header_bytes=config.max_header_bytes, max_header_count=config.max_header_count,
                        max_body_bytes=config.max_body_bytes)
        cases = [c for c in build_corpus(target) if c.family == "body"]
        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(lambda case: _run(server, case), cases))
        wrong = [f"{case.name}: {problem}" for case, out in results if (problem := _verdict(case, out)) is not None]
        assert not wrong, f"{len(wrong)} of {len(results)}:\n" + "\n".join(wrong[:40])
        rejected = sum(c.engine_rejects for c in cases)
        records = admin.records(session["session_id"])
        assert [r["metadata"]["status"] for r in records] == ["failed"] * rejected
        assert [r["metadata"]["call_index"] for r in records] == list(range(rejected))
