"""A rollout's outcome (its reward, or why it has none) is stored beside its records: durable across
a restart, readable from the store file, refused when it says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.client import RecorderAPIError
from openenv_harness.recorder.store.sqlite import SQLiteStore
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN


def _config(tmp_path: Path, engine: EngineServer) -> RecorderConfig:
    return RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url, admin_token=ADMIN)


def test_an_outcome_survives_a_restart_and_reaches_the_store_file(tmp_path: Path, engine: EngineServer) -> None:
    with RecorderServer(_config(tmp_path, engine)) as server, RecorderClient(server.url, ADMIN) as client:
        scored = client.create_session()["session_id"]
        unscored = client.create_session()["session_id"]
        client.close_session(scored)  # a closed session still takes its outcome (its row, not records)
        assert client.set_outcome(scored, reward=0.5)["outcome"] == {"reward": 0.5, "unscored_reason": None}
        client.set_outcome(unscored, reward=None, unscored_reason="sandbox failed: gone")
    with RecorderServer(_config(tmp_path, engine)) as server, RecorderClient(server.url, ADMIN) as client:
        assert client.session(scored)["outcome"] == {"reward": 0.5, "unscored_reason": None}
        assert client.session(unscored)["outcome"] == {"reward": None, "unscored_reason": "sandbox failed: gone"}
    rows = {row.session_id: row for row in SQLiteStore(tmp_path / "records.db").load_sessions()}
    assert rows[scored].state["outcome"]["reward"] == 0.5


def test_an_outcome_that_says_nothing_or_names_no_session_is_refused(tmp_path: Path, engine: EngineServer) -> None:
    with RecorderServer(_config(tmp_path, engine)) as server, RecorderClient(server.url, ADMIN) as client:
        sid = client.create_session()["session_id"]
        with pytest.raises(RecorderAPIError) as silent:
            client.set_outcome(sid, reward=None)
        assert silent.value.status == 422 and "unscored_reason" in str(silent.value)
        with pytest.raises(RecorderAPIError) as unknown:
            client.set_outcome("nobody", reward=1.0)
        assert unknown.value.status == 404
        with pytest.raises(RecorderAPIError) as bad:
            client._call("POST", f"/admin/sessions/{sid}/outcome", content=b'{"reward": "high"}',
                         headers={"content-type": "application/json"})
        assert bad.value.status == 422
        assert client.session(sid)["outcome"] is None, "nothing was stored by the refused calls"
