"""The real Pi and OpenCode CLIs through the recorder onto an SGLang engine (the reference engine's SGLang
0.5.23 flavour), in both prompt modes: reward 1, exact chains, and every request the recorder sent and
every reply it read held to SGLang 0.5.23's own classes (``openenv_harness.testing.sglang_models``)."""

from __future__ import annotations

import tempfile
from typing import Any

import httpx
import pytest

from openenv_harness.assembly import assemble_session
from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.testing.engine import SESSION_HEADER, EngineConfig, EngineServer, Script
from openenv_harness.testing.sglang_models import SGLANG_ROUTE_KINDS, check_sglang_payloads

from rollout_helpers import ADMIN

pytestmark = pytest.mark.cli
TASK = "fix-add"
#: the engine's deterministic replies: a request sent again gets the reply the recorder read
_REPLAYED = ("/v1/chat/completions", "/v1/tokenize", "/v1/detokenize")


def _rollout(harness: str, mode: str) -> tuple[list[dict[str, Any]], float, list[dict[str, Any]]]:
    """One rollout; its records, reward, and each SGLang exchange ``{path, request, reply}`` the recorder made."""
    model = f"ref-{harness}-{TASK}"
    with tempfile.TemporaryDirectory() as tmp, EngineServer(EngineConfig(family="sglang")) as engine:
        engine.set_script(model, Script(turns=BUILTIN_TASKS[TASK].reference_script))
        config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=engine.url, admin_token=ADMIN,
                                engine_family="sglang")
        with RecorderServer(config) as recorder:
            factory = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN,
                                            model=model, prompt_mode=mode, prompt_mode_strict=mode == "incremental")
            session = factory.create(TASK)
            try:
                code = session.wait_for_completion(timeout_s=120)
                assert code == 0, session.agent.output()
                reward = session.verify([]).env_reward
                records = session.client.records(session.session_id)
            finally:
                session.close()
            exchanges = []
            for entry in engine.requests():
                path = entry["path"]
                if path not in SGLANG_ROUTE_KINDS:
                    continue
                reply = None
                if path in _REPLAYED:
                    headers = {SESSION_HEADER: entry["headers"][SESSION_HEADER.lower()]} \
                        if SESSION_HEADER.lower() in entry["headers"] else {}
                    answered = httpx.post(engine.url + path, json=entry["body"], headers=headers, timeout=60)
                    assert answered.status_code == 200, (path, answered.text)
                    reply = answered.json()
                exchanges.append({"path": path, "request": entry["body"], "reply": reply})
    return records, reward, exchanges


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], tuple[list[dict[str, Any]], float, list[dict[str, Any]]]]:
    return {(h, m): _rollout(h, m) for h in ("pi", "opencode") for m in ("incremental", "full_history")}


@pytest.mark.parametrize("mode", ["incremental", "full_history"])
@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_a_rollout_on_sglang_scores_and_chains_exactly(runs: Any, harness: str, mode: str, cli_paths: Any) -> None:
    records, reward, _ = runs[(harness, mode)]
    assert reward == 1.0
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) >= 2 and all(r["metadata"]["status"] == "ok" for r in agent)
    assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root"] + ["exact"] * (len(agent) - 1)
    for prev, rec in zip(agent, agent[1:]):
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    trace = assemble_session(records)
    assert trace.stats.breaks == 0 and trace.stats.trainable_tokens == sum(len(c.completion) for c in trace.calls)
    modes = [r["metadata"].get("prompt_mode") or {} for r in agent]
    if mode == "incremental":
        assert [m.get("continued") for m in modes] == [False] + [True] * (len(agent) - 1), modes
        assert all(m["sampled_via"] == "/v1/chat/completions (input_ids)" for m in modes[1:])
        assert all(m["full_render_diff"]["identical"] for m in modes[1:])


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_every_request_and_reply_is_sglangs_own(runs: Any, harness: str, cli_paths: Any) -> None:
    """Checked by SGLang 0.5.23's classes: no error, and no key SGLang does not declare -- but in messages,
    which are forwarded as written: the agent's (Pi's assistant turns carry a ``reasoning`` field SGLang's
    message model does not name; it ignores it in every route alike) and the template certification's,
    which probes which reasoning field name the engine renders."""
    items, where = [], []
    for mode in ("incremental", "full_history"):
        for exchange in runs[(harness, mode)][2]:
            request_kind, reply_kind = SGLANG_ROUTE_KINDS[exchange["path"]]
            items.append({"kind": request_kind, "payload": exchange["request"]})
            where.append((mode, exchange["path"], "request"))
            if reply_kind is not None and exchange["reply"] is not None:
                items.append({"kind": reply_kind, "payload": exchange["reply"]})
                where.append((mode, exchange["path"], "reply"))
    paths = {w[1] for w in where}
    assert {"/v1/chat/completions", "/v1/tokenize"} <= paths, paths
    verdicts = check_sglang_payloads(items)
    def ours(unknown: list[str]) -> list[str]:
        return [key for key in unknown if not key.startswith("messages[")]

    bad = [(w, v["error"], ours(v["unknown"])) for w, v in zip(where, verdicts) if not v["ok"] or ours(v["unknown"])]
    assert bad == [], sorted({(w[1], w[2], str(e)[:300], tuple(u)) for w, e, u in bad})
