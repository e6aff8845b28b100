"""Evidence extraction: every malformed reply is caught and named, never silently trained on."""

from __future__ import annotations

import math

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
