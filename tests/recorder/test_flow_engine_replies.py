"""What the recorder does with real-vLLM reply features, through a scripted engine over HTTP.

An engine abort (vLLM answers HTTP 200 with ``finish_reason: "abort"``) is a partial sample:
recorded untrainable with its partial ids, and the agent is told to retry the whole call. Per-token
weight versions (vLLM 0.33) are kept per call. A pinned tool choice applies where tools are offered.
"""

from __future__ import annotations

import httpx
import orjson

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.upstream import HTTPEngine

ADMIN = "admin-" + "a" * 32
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _reply(finish: str, ids: list[int], **choice_extra: object) -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "partial"}, "finish_reason": finish,
                     "token_ids": ids, "logprobs": {"content": [{"token": "x", "logprob": -0.1} for _ in ids]},
                     **choice_extra}],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)},
    })


def test_an_aborted_call_is_kept_partial_and_the_retry_is_sampled_again(tmp_path) -> None:
    answers = [_reply("abort", [5, 6]), _reply("stop", [5, 6, 7, 8])]
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        sent.append(orjson.loads(request.content))
        return httpx.Response(200, content=answers[len(sent) - 1], headers={"content-type": "application/json"})

    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, probe_template=False, probe_logprobs_mode=False)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(handler))
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        auth = {"authorization": f"Bearer {s['secret']}"}
        first = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body)
        assert first.status_code == 503 and first.json()["error"]["code"] == "engine_aborted"
        assert first.headers["retry-after"]
        retry = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body)  # byte-identical
        assert retry.status_code == 200 and retry.json()["choices"][0]["finish_reason"] == "stop"
        records = admin.records(s["session_id"])
    assert len(sent) == 2  # the retry was sampled again, not answered from the aborted record
    aborted, answered = records
    md = aborted["metadata"]
    assert (md["status"], md["trainable"], md["partial"], md["finish_reason"]) == ("invalid", False, True, "abort")
    assert aborted["completion_token_ids"] == [5, 6] and aborted["per_token_logps"] == [-0.1, -0.1]
    assert md["error"]["kind"] == "engine_aborted"
    assert answered["metadata"]["status"] == "ok" and answered["metadata"]["partial"] is False
    assert answered["metadata"]["fidelity"]["class"] == "root"  # the partial sample joined no chain
    assert answered["metadata"]["limits"]["agent_calls"] == 1  # only the answered call counts against the budget


def test_a_pinned_tool_choice_skips_calls_without_tools(tmp_path) -> None:
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        sent.append(orjson.loads(request.content))
        return httpx.Response(200, content=_reply("stop", [5]), headers={"content-type": "application/json"})

    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, probe_template=False, probe_logprobs_mode=False)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(handler))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session(sampling={"tool_choice": "required", "temperature": 0})
        auth = {"authorization": f"Bearer {s['secret']}"}
        for extra in ({"tools": TOOLS}, {}, {"tool_choice": "none"}):
            body = {"model": "m", "messages": [{"role": "user", "content": "go"}], **extra}
            assert httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body).status_code == 200
        records = admin.records(s["session_id"])
    assert [b.get("tool_choice", "-") for b in sent] == ["required", "-", "none"]
    assert all(b["temperature"] == 0 for b in sent)
    assert [r["metadata"]["provenance"]["decoding_constraint"] for r in records] == [
        {"tool_choice": "required"}, None, None]
    assert [r["metadata"]["logprobs_are_policy"] for r in records] == [False, True, True]


def test_per_token_weight_versions_are_recorded_and_not_shown_to_the_agent(tmp_path) -> None:
    versions = [{"version": 3, "start": 0, "end": 1}, {"version": 4, "start": 1, "end": 2}]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        return httpx.Response(200, content=_reply("stop", [5, 6], weight_versions=versions),
                              headers={"content-type": "application/json"})

    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, probe_template=False, probe_logprobs_mode=False)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(handler))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        reply = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS})
        [record] = admin.records(s["session_id"])
    assert reply.status_code == 200 and "weight_versions" not in reply.json()["choices"][0]
    md = record["metadata"]
    assert md["weight_versions"] == versions
    assert (md["policy_version_start"], md["policy_version_end"]) == (0, 0)  # the recorder's own, kept as well
