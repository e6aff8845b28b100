"""Evidence extraction: every malformed reply is caught and named, never silently trained on."""

from __future__ import annotations

import math

import pytest

from openenv_harness.recorder.validate import agent_view, extract_evidence


def reply(**over) -> dict:
    base = {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2, 3, 4],
        "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
            "token_ids": [7, 8],
            "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:8", "logprob": -0.25}]},
        }],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    base.update(over)
    return base


def choice(**over) -> list[dict]:
    c = dict(reply()["choices"][0])
    c.update(over)
    return [c]


def test_good_reply_is_valid() -> None:
    ev = extract_evidence(reply())
    assert ev.valid, ev.reasons
    assert ev.prompt_ids.tolist() == [1, 2, 3, 4]
    assert ev.completion_ids.tolist() == [7, 8]
    assert ev.logprobs.tolist() == [-0.5, -0.25]
    assert ev.completion_tokens is None and ev.finish_reason == "stop"


def test_ids_recovered_from_token_id_strings_when_absent() -> None:
    c = choice()
    del c[0]["token_ids"]
    ev = extract_evidence(reply(choices=c))
    assert ev.valid, ev.reasons
    assert ev.completion_ids.tolist() == [7, 8]
    assert ev.completion_tokens == ["token_id:7", "token_id:8"]


def test_bad_sampled_ids_keep_the_token_strings_as_evidence_and_are_not_replaced_by_them() -> None:
    ev = extract_evidence(reply(choices=choice(token_ids=[7, -8])))
    assert not ev.valid and ev.completion_ids is None
    assert "choices[0].token_ids contains a value that is not a non-negative integer id" in ev.reasons
    assert ev.completion_tokens == ["token_id:7", "token_id:8"]  # kept, but never turned into ids


def test_null_ids_are_missing_ids_not_empty_evidence() -> None:
    # an engine that does not honour return_token_ids may still send the fields, as null
    ev = extract_evidence(reply(prompt_token_ids=None, choices=choice(token_ids=None)))
    assert not ev.valid and ev.prompt_ids is None
    assert "engine returned no prompt_token_ids" in ev.reasons
    assert ev.completion_ids.tolist() == [7, 8]  # recovered from the "token_id:N" strings, as when absent
    plain = choice(token_ids=None, logprobs={"content": [{"token": "hi", "logprob": -0.5},
                                                       {"token": "!", "logprob": -0.25}]})
    ev = extract_evidence(reply(choices=plain))
    assert not ev.valid and ev.completion_ids is None
    assert "engine returned no completion token ids" in ev.reasons


def test_missing_everything_is_named() -> None:
    c = choice()
    del c[0]["token_ids"]
    c[0]["logprobs"] = {"content": [{"token": "hi", "logprob": -0.1}]}
    r = reply(choices=c)
    del r["prompt_token_ids"]
    ev = extract_evidence(r)
    assert "engine returned no prompt_token_ids" in ev.reasons
    assert "engine returned no completion token ids" in ev.reasons


def test_bad_values() -> None:
    cases = {
        "prompt_token_ids contains a value that is not a non-negative integer id": reply(prompt_token_ids=[1, -2]),
        "prompt_token_ids contains a value that is not a non-negative integer id ": reply(prompt_token_ids=[1, 2.5]),
        "a logprob is not finite": reply(choices=choice(logprobs={"content": [{"logprob": math.nan}, {"logprob": -1}]})),
        "a logprob is positive": reply(choices=choice(logprobs={"content": [{"logprob": 0.5}, {"logprob": -1}]})),
        "2 sampled ids but 1 logprobs": reply(choices=choice(logprobs={"content": [{"logprob": -1.0}]})),
        "usage.completion_tokens=3 but 2 sampled ids": reply(usage={"prompt_tokens": 4, "completion_tokens": 3}),
        "usage.prompt_tokens=9 but 4 prompt ids": reply(usage={"prompt_tokens": 9, "completion_tokens": 2}),
        "reply must have exactly one choice": reply(choices=choice() * 2),
        "engine returned no logprobs": reply(choices=choice(logprobs=None)),
    }
    for expected, r in cases.items():
        ev = extract_evidence(r)
        assert not ev.valid
        assert expected.strip() in ev.reasons, (expected, ev.reasons)


def test_infinite_logprob_is_not_finite() -> None:
    ev = extract_evidence(reply(choices=choice(logprobs={"content": [{"logprob": -math.inf}, {"logprob": -1}]})))
    assert "a logprob is not finite" in ev.reasons


def test_agent_view_strips_engine_only_fields() -> None:
    r = reply(prompt_logprobs=None, kv_transfer_params=None)
    view = agent_view(r, keep_logprobs=False)
    assert "prompt_token_ids" not in view and "prompt_logprobs" not in view and "kv_transfer_params" not in view
    assert "token_ids" not in view["choices"][0] and "logprobs" not in view["choices"][0]
    assert r["prompt_token_ids"] == [1, 2, 3, 4]  # input untouched
    kept = agent_view(r, keep_logprobs=True)
    assert kept["choices"][0]["logprobs"] == r["choices"][0]["logprobs"]


def test_bad_ids_in_a_later_turn_are_named_through_the_whole_recorder(tmp_path) -> None:
    """The recorder reads each prompt's new part only; a bad id there is still named, and the calls
    around it keep exact ids (an engine scripted over real HTTP handling in httpx)."""
    import httpx
    import orjson

    from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
    from openenv_harness.recorder.upstream import HTTPEngine

    prompts = [b"1,2,3", b"1,2,3,7,8,-9", b"1,2,3,7,8,9", b"1,2,3,7,8,9,7,8,", b"1,2,3,7,8,9,7,8,10"]
    served: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        span = prompts[len(served)]
        served.append(span)
        body = orjson.dumps(reply(prompt_token_ids=None, usage={"prompt_tokens": span.count(b",") + 1,
                                                                "completion_tokens": 2, "total_tokens": 0}))
        return httpx.Response(200, content=body.replace(b'"prompt_token_ids":null', b'"prompt_token_ids":[' + span + b"]"),
                              headers={"content-type": "application/json"})

    admin_token = "admin-" + "x" * 32
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=admin_token, probe_template=False, probe_logprobs_mode=False)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(handler))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, admin_token) as admin:
        s = admin.create_session()
        statuses = []
        for turn in range(len(prompts)):
            r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                           json={"model": "m", "messages": [{"role": "user", "content": f"turn {turn}"}]})
            statuses.append(r.status_code)
            if r.status_code == 200:
                assert "prompt_token_ids" not in r.json()
        assert statuses == [200, 200, 200, 502, 200]  # turn 3 is not JSON at all: the engine's error
        records = admin.records(s["session_id"])
    assert [rec["metadata"]["status"] for rec in records] == ["ok", "invalid", "ok", "failed", "ok"]
    assert any("not a non-negative integer" in why for why in records[1]["metadata"]["invalid_reasons"])
    assert records[1]["metadata"]["trainable"] is False
    assert records[0]["prompt_token_ids"] == [1, 2, 3]
    assert records[2]["prompt_token_ids"] == [1, 2, 3, 7, 8, 9]
    assert records[4]["prompt_token_ids"] == [1, 2, 3, 7, 8, 9, 7, 8, 10]


def test_agent_view_keeps_only_what_a_plain_openai_server_sends() -> None:
    """A rule, not a list: every field an engine adds is gone, including ones no engine has yet."""
    r = reply(prompt_text="<|im_start|>...", kv_transfer_params=None, ec_transfer_params=None, metrics=None,
              prompt_logprobs=None, service_tier=None, system_fingerprint="vllm-0.32.0-x", future_token_ids=[1])
    c = r["choices"][0]
    c.update(stop_reason=151643, routed_experts=None, weight_versions=[{"version": 1, "start": 0, "end": 2}])
    c["message"] = {"role": "assistant", "content": "hi", "refusal": None, "annotations": None, "audio": None,
                    "function_call": None, "reasoning": "r", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}",
                                                                        "extra_ids": [3]}, "token_ids": [9]}]}
    r["usage"] = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6, "prompt_tokens_details": None,
                  "completion_tokens_details": {"engine": 1}}
    view = agent_view(r, keep_logprobs=True)
    assert set(view) == {"id", "choices", "usage", "system_fingerprint", "service_tier"}
    choice = view["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert set(choice["message"]) == {"role", "content", "refusal", "annotations", "audio", "function_call",
                                      "reasoning", "tool_calls"}
    assert choice["message"]["tool_calls"] == [{"id": "call_1", "type": "function",
                                                "function": {"name": "bash", "arguments": "{}"}}]
    assert view["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert all(set(e) <= {"token", "logprob", "bytes", "top_logprobs"} for e in choice["logprobs"]["content"])
    assert c["stop_reason"] == 151643 and "token_ids" in c  # input untouched
@pytest.mark.parametrize("where, value", [
    ("prompt_token_ids", [5, True, 6]), ("prompt_token_ids", [False]), ("token_ids", [1, 0, True]),
])
def test_json_booleans_are_not_ids(where: str, value: list) -> None:
    r = reply()
    if where == "token_ids":
        r["choices"][0]["token_ids"] = value
        r["choices"][0]["logprobs"]["content"] = [{"token": "t", "logprob": -0.1}] * len(value)
        r["usage"]["completion_tokens"] = len(value)
    else:
        r[where] = value
        r["usage"]["prompt_tokens"] = len(value)
    ev = extract_evidence(r)
    assert not ev.valid and any("not a non-negative integer id" in x for x in ev.reasons), ev.reasons
    good = reply()
    good["prompt_token_ids"] = [0, 1, 1, 0]  # real ids 0 and 1 stay ids
    good["usage"]["prompt_tokens"] = 4
    assert extract_evidence(good).valid


def test_a_false_logprob_is_not_zero() -> None:
    r = reply()
    r["choices"][0]["logprobs"]["content"][0]["logprob"] = False
    assert not extract_evidence(r).valid
    r["choices"][0]["logprobs"]["content"][0]["logprob"] = 0  # a JSON number 0 is a logprob of 0
    assert extract_evidence(r).valid


@pytest.mark.parametrize("token", ["token_id: 7", "token_id:+7", "token_id:07", "token_id:7_0", "token_id:\u0667",
                                   "token_id:", "token_id:-7", "token_id:4294967296"])
def test_token_id_strings_are_read_only_as_vllm_writes_them(token: str) -> None:
    r = reply()
    choice = r["choices"][0]
    choice.pop("token_ids")
    content = choice["logprobs"]["content"]
    content[-1]["token"] = token
    ev = extract_evidence(r)
    assert not ev.valid and "engine returned no completion token ids" in ev.reasons
