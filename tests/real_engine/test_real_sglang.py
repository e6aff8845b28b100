"""The real SGLang 0.5.23 on this CPU (``openenv_harness.engine.sglang_cpu``: its CPU engine, torch-native
layers) serving the real Qwen2.5-Coder-0.5B-Instruct, behind a recorder with ``engine_family="sglang"``:
a real Pi rollout in incremental mode, every record what SGLang rendered and sampled.

- the chain's first prompt is SGLang's own tokenization of the agent's messages (``/v1/tokenize``, its chat
  template), and every continued prompt is the exact previous prompt and sample followed by SGLang's own
  rendering of the new messages -- the tail of its full render of the same messages;
- every sampled id and logprob is SGLang's (its chat reply's ``response_token_ids`` and
  ``meta_info.output_token_logprobs``, read through a capture proxy);
- continued calls are sampled by SGLang's chat route from ``input_ids``.

Sampling is pinned as on the vLLM tier (greedy, seeded, ``tool_choice: "required"``: SGLang constrains the
call with its grammar, so the model calls tools and the rollout has turns to continue).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from capture_proxy import CaptureProxy
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.engine.sglang_cpu import SGLangServer, SGLangSettings, ensure_sglang
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from real_stack import MODEL, RealStack

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow]

AGENT_CALLS = 3
ROLLOUT_WALL_S = 900


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    python, model = ensure_sglang()
    server = SGLangServer(SGLangSettings(model_dir=model, python=python),
                          log_path=tmp_path_factory.mktemp("sglang") / "sglang.log").start(timeout_s=600)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rollout(sglang: SGLangServer, tmp_path_factory: pytest.TempPathFactory, cli_paths: Any) -> dict[str, Any]:
    capture = CaptureProxy(sglang.url).start()
    stack = RealStack(tmp_path_factory.mktemp("sglang-rollout") / "records.db", capture.url, engine_family="sglang")
    try:
        factory = HarnessSessionFactory(harness="pi", recorder_url=stack.recorder.url, admin_token=stack.admin_token,
                                        model=MODEL, prompt_mode="incremental",
                                        tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                        budgets={"max_agent_calls": AGENT_CALLS, "max_wall_clock_s": ROLLOUT_WALL_S},
                                        sampling={**REAL_ENGINE_SAMPLING, "max_tokens": 128})
        report, session = run_rollout(factory, "fix-add", timeout_s=ROLLOUT_WALL_S + 60)
        assert session is not None, report.error
        records = stack.admin.records(session.session_id)
        session.close()
        return {"report": report, "records": records, "chats": capture.chat_exchanges()}
    finally:
        stack.close()
        capture.stop()


def _tokenize(url: str, request: dict[str, Any]) -> list[int]:
    body = {"model": MODEL, "messages": request["messages"], "add_generation_prompt": True}
    if request.get("tools"):
        body["tools"] = request["tools"]
    reply = httpx.post(url + "/v1/tokenize", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    tokens: list[int] = reply.json()["tokens"]
    return tokens


def test_records_are_what_sglang_rendered_and_sampled(rollout: dict[str, Any], sglang: SGLangServer) -> None:
    report, records = rollout["report"], rollout["records"]
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert report.agent_calls == len(agent) >= 2, (report, [r["metadata"]["status"] for r in records])
    assert all(r["metadata"]["status"] == "ok" for r in agent), [r["metadata"].get("invalid_reasons") for r in agent]
    # the root prompt is SGLang's own rendering of the agent's messages
    assert agent[0]["prompt_token_ids"] == _tokenize(sglang.url, agent[0]["request"])
    # every sample is SGLang's: ids and logprobs as its chat route answered them
    replies = {tuple(c["prompt_token_ids"]): c for e in rollout["chats"] if e.status == 200
               and (e.request_json() or {}).get("return_token_ids") is True for c in e.reply_json()["choices"]}
    for record in agent:
        choice = replies[tuple(record["prompt_token_ids"])]
        assert record["completion_token_ids"] == choice["response_token_ids"]
        assert record["per_token_logps"] == [lp for lp, _id, *_ in choice["meta_info"]["output_token_logprobs"]]
        assert record["metadata"]["provenance"]["sampling"]["temperature"] == 0
        # measured on SGLang by the recorder: its logprobs are of the distribution it samples from
        assert record["metadata"]["provenance"]["logprobs_mode"] == "processed_logprobs"


def test_continued_calls_extend_the_exact_chain_with_sglangs_render_of_the_new_messages(
        rollout: dict[str, Any], sglang: SGLangServer) -> None:
    agent = [r for r in rollout["records"] if r["metadata"]["call_kind"] == "agent"]
    modes = [r["metadata"]["prompt_mode"] for r in agent]
    assert [m["continued"] for m in modes] == [False] + [True] * (len(agent) - 1), modes
    for prev, record, mode in zip(agent, agent[1:], modes[1:]):
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        prompt = record["prompt_token_ids"]
        assert prompt[:len(chain)] == chain  # the exact previous prompt and sample
        full = _tokenize(sglang.url, record["request"])
        assert full[len(full) - mode["suffix_len"]:] == prompt[len(prompt) - mode["suffix_len"]:]
        assert mode["sampled_via"] == "/v1/chat/completions (input_ids)"
        assert record["metadata"]["fidelity"]["class"] == "exact"
    # what a continued call sent: the prompt as ids beside the messages SGLang parses with
    continued = [e.request_json() for e in rollout["chats"] if "input_ids" in (e.request_json() or {})]
    assert len(continued) == len(agent) - 1
    assert all(body["return_meta_info"] and body["messages"] for body in continued)


def test_a_weight_sync_through_the_fence_on_sglang(sglang: SGLangServer, tmp_path: Path) -> None:
    """SGLang's own reload from disk, cache flush and version label, in the sync's order: the version moves
    only when all of them were done; a folder it cannot load is rolled back at the old version."""
    from openenv_harness.trainer.weight_sync import DiskWeightSync, SyncRolledBack

    model_dir = sglang.settings.model_dir
    stack = RealStack(tmp_path / "records.db", sglang.url, engine_family="sglang")
    try:
        sync = DiskWeightSync(stack.admin, sglang.url, base_weights=model_dir, family="sglang", timeout_s=600)
        report = sync.sync(model_dir, version_before=0)
        assert (report.outcome, report.version_after, report.engine_weight_version) == ("ok", 1, "1")
        assert httpx.get(sglang.url + "/model_info", timeout=30).json()["weight_version"] == "1"
        session_id, secret = stack.session()
        reply = stack.chat(session_id, secret, {"model": MODEL, "max_tokens": 8, "temperature": 0,
                                                "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status_code == 200, reply.text
        record = stack.admin.records(session_id)[-1]
        md = record["metadata"]
        assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (1, 1, False)
        assert md["weight_versions"] == [{"version": "1", "start": 0, "end": len(record["completion_token_ids"])}]
        empty = tmp_path / "no-weights"
        empty.mkdir()
        with pytest.raises(SyncRolledBack) as raised:
            sync.sync(empty, version_before=1)
        assert raised.value.report.engine_weights == str(model_dir.resolve())
        assert stack.admin.health()["fence"]["policy_version"] == 1
        assert httpx.get(sglang.url + "/model_info", timeout=30).json()["weight_version"] == "1"
    finally:
        stack.close()
