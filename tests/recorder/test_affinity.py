"""Each session's trajectory affinity key: fresh per session, the trainer's when given, kept across a
restart, sent upstream on every engine call and recorded in each record's provenance."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderAPIError, RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, TOOLS


def test_keys_are_fresh_per_session_given_ones_are_kept_and_bad_ones_refused(admin: RecorderClient) -> None:
    keys = [admin.create_session()["affinity_key"] for _ in range(3)]
    assert len(set(keys)) == 3 and all(k.startswith("t-") for k in keys)
    assert admin.create_session(affinity_key="group-7:member-2")["affinity_key"] == "group-7:member-2"
    with pytest.raises(RecorderAPIError) as err:
        admin.create_session(affinity_key="no spaces\r\nX-Evil: 1")
    assert err.value.status == 422


def test_the_key_goes_upstream_is_recorded_and_survives_a_restart(tmp_path: Path, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                       json={"model": "reference-model", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS},
                       timeout=60)
        assert r.status_code == 200
        [seen] = engine.requests(s["session_id"])
        assert seen["headers"]["x-session-id"] == s["affinity_key"]
        assert admin.records(s["session_id"])[0]["metadata"]["provenance"]["affinity_key"] == s["affinity_key"]
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        assert admin.session(s["session_id"])["affinity_key"] == s["affinity_key"]
