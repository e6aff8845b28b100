"""A stored step-0 verification (``trace verify``) shows per call in the viewer's data route."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Script, Turn
from openenv_harness.trainer.verify import CallVerification, DeltaStats, RefusedCall, RolloutVerification
from openenv_harness.viewer.verifications import verification_path

ADMIN = "viewer-verify-admin-0123456789abcdef"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def test_calls_carry_their_verification_when_one_was_stored(tmp_path: Path) -> None:
    store = tmp_path / "records.db"
    with EngineServer() as engine:
        config = RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
            s = admin.create_session()
            engine.set_script(s["session_id"], Script(turns=[Turn(content="one"), Turn(content="two")]))
            for text in ("a", "b"):
                r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                               json={"model": "m", "messages": [{"role": "user", "content": text}], "tools": TOOLS})
                assert r.status_code == 200, r.text
            route = f"{server.url}/admin/viewer/api/sessions/{s['session_id']}/calls"
            auth = {"authorization": f"Bearer {ADMIN}"}
            before = httpx.get(route, headers=auth).json()["calls"]
            stats = DeltaStats(tokens=3, delta_max=0.01, delta_mean=0.004, ratio_min=0.99, ratio_max=1.01,
                               mean_log_ratio=-0.002, kl_k3=1e-5)
            report = RolloutVerification(s["session_id"], [CallVerification(f"{s['session_id']}/1", 1, False, stats)],
                                         stats, DeltaStats(), "bfloat16", 0.05)
            report.refused.append(RefusedCall(f"{s['session_id']}/0", 0, False, ["truncated sampling (top_p=0.8)"]))
            path = verification_path(str(store), s["session_id"])
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"model": "/models/policy", **report.as_dict()}))
            after = httpx.get(route, headers=auth).json()["calls"]
    assert [c["verification"] for c in before] == [None, None]
    refused = after[0]["verification"]  # call 0 was refused, not scored: it says why and shows no numbers
    assert refused["refused"] == ["truncated sampling (top_p=0.8)"] and "delta_max" not in refused
    v = after[1]["verification"]
    assert v["delta_max"] == 0.01 and v["ratio_min"] == 0.99 and v["constrained"] is False and v["refused"] is None
    assert v["mean_log_ratio"] == -0.002 and v["kl_k3"] == 1e-5 and "kl" not in v
    assert v["model"] == "/models/policy" and v["dtype"] == "bfloat16"
    assert v["verdict"] == "cannot verify"  # the session's verdict: a policy call could not be scored
