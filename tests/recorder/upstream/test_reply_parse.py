"""Reading an engine reply's prompt ids straight into an array, and every case that must not."""

from __future__ import annotations

import json
from array import array

import orjson
import pytest

from openenv_harness.recorder.upstream.reply_parse import parse_chat_reply, parse_json_object
from openenv_harness.recorder.validate import extract_evidence


def _reply(prompt: object, **extra: object) -> dict:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [7, 2],
                     "message": {"role": "assistant", "content": 'says "prompt_token_ids":[1,2] in text'},
                     "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5},
                                              {"token": "token_id:2", "logprob": -0.25}]}}],
        "usage": {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 0, "completion_tokens": 2},
        "prompt_token_ids": prompt, **extra,
    }


@pytest.mark.parametrize("encode", [orjson.dumps, lambda v: json.dumps(v).encode()], ids=["compact", "spaced"])
def test_the_ids_arrive_as_an_array_and_the_rest_as_the_full_parse_has_it(encode) -> None:
    prompt = [0, 1, 151643, 4294967295, *range(1000, 9000)]
    raw = encode(_reply(prompt))
    reply, ids = parse_chat_reply(raw)
    full = orjson.loads(raw)
    if b'"prompt_token_ids":[' not in raw:  # json.dumps writes '": [': the full parse, still right
        assert ids is None and reply == full
        return
    assert ids is not None and ids.typecode == "I" and ids.tolist() == prompt
    assert reply is not None and reply["prompt_token_ids"] is None
    assert {k: v for k, v in reply.items() if k != "prompt_token_ids"} == {k: v for k, v in full.items()
                                                                           if k != "prompt_token_ids"}
    ev = extract_evidence(reply, ids)
    assert ev.valid and ev.prompt_ids == array("I", prompt) and ev.completion_ids.tolist() == [7, 2]


@pytest.mark.parametrize("prompt, reason", [
    ([1, -2, 3], "not a non-negative integer"),
    ([1, 2.5, 3], "not a non-negative integer"),
    ([1, 4294967296], "not a non-negative integer"),
    ([1, 10**19], "not a non-negative integer"),
    ([1, "2"], "not a non-negative integer"),
    ([], "is empty"),
])
def test_doubtful_ids_take_the_full_parse_and_validation_names_them(prompt: list, reason: str) -> None:
    reply, ids = parse_chat_reply(orjson.dumps(_reply(prompt)))
    if prompt:
        assert ids is None and reply is not None and reply["prompt_token_ids"] == prompt
    ev = extract_evidence(reply, ids)
    assert not ev.valid and any(reason in r for r in ev.reasons), ev.reasons


def test_malformed_spans_and_nested_keys_fall_back_to_the_full_parse() -> None:
    good = orjson.dumps(_reply([5, 6]))
    for raw in (
        good.replace(b"[5,6]", b"[5,,6]"),  # not JSON at all: neither parse accepts it
        good.replace(b"[5,6]", b"[5,6,]"),
    ):
        assert parse_chat_reply(raw) == (None, None)
    # the key nested deeper, once, and no top-level field: the nested list stays where it was
    nested = orjson.dumps({"choices": [{"prompt_token_ids": [1, 2], "token_ids": [3]}]})
    reply, ids = parse_chat_reply(nested)
    assert ids is None and reply == orjson.loads(nested)
    # twice (nested and top level): never guess which one is meant
    both = orjson.dumps({"extra": {"prompt_token_ids": [9]}, "prompt_token_ids": [1, 2]})
    reply, ids = parse_chat_reply(both)
    assert ids is None and reply == orjson.loads(both)


def test_python_json_engines_keep_their_nan_for_validation() -> None:
    raw = b'{"choices":[{"logprobs":{"content":[{"token":"a","logprob":NaN}]}}],"prompt_token_ids":[1,2]}'
    reply, ids = parse_chat_reply(raw)
    assert reply is not None and ids is not None and ids.tolist() == [1, 2]
    assert reply["choices"][0]["logprobs"]["content"][0]["logprob"] != 0  # NaN survived the parse
    assert any("not finite" in r for r in extract_evidence(reply, ids).reasons)
    huge = orjson.dumps(_reply([5, 6])).replace(b"[5,6]", b"[5,100000000000000000000000000000]")  # beyond int64
    reply, ids = parse_chat_reply(huge)
    assert ids is None and reply is not None
    assert any("not a non-negative integer" in r for r in extract_evidence(reply, ids).reasons)
    assert parse_json_object(b"[1, 2]") is None and parse_json_object(b"") is None
    assert parse_json_object(b"not json") is None
