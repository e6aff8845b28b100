"""Reading an engine reply's prompt ids straight into an array, and every case that must not."""

from __future__ import annotations

import json
from array import array

import orjson
import pytest

from openenv_harness.recorder.upstream.reply_parse import (
    PromptIdsReader,
    parse_chat_reply,
    parse_json_object,
    read_ids,
    split_chat_reply,
)
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


def _span(ids: list[int], sep: bytes = b",") -> bytes:
    return sep.join(str(i).encode() for i in ids)


def test_the_reader_reuses_a_prompt_it_extends_and_matches_a_whole_parse_every_time() -> None:
    reader = PromptIdsReader()
    history = [151644, 8948, 198, *range(1000, 3000)]
    first = reader.read(_span(history))
    assert first is not None and first.tolist() == history
    for turn in range(5):  # each call repeats the history and adds a turn, as agents do
        history += [7 * turn + 1, 4294967295, 0, 42]
        got = reader.read(_span(history))
        assert got is not None and got.typecode == "I" and got.tolist() == history
        assert got.tolist() == read_ids(_span(history)).tolist()
    assert reader.read(_span(history)).tolist() == history  # the same prompt again
    # ", "-separated lists (Python-json engines) extend the same way
    spaced = PromptIdsReader()
    assert spaced.read(_span([1, 2, 3], b", ")).tolist() == [1, 2, 3]
    assert spaced.read(_span([1, 2, 3, 4, 5], b", ")).tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("span", [
    b"1,2,3,",  # a trailing comma after the known prompt
    b"1,2,3,-4",  # a negative id in the new part
    b"1,2,3,4.5",
    b"1,2,3,4294967296",  # beyond uint32
    b"1,2,3,,4",  # an empty field
    b'1,2,3,"4"',
    b"1,2,3,04",  # a leading zero is not a JSON number
    b"1,2,3,[4",  # a nested list (its "]" ended the span)
    b"1,2,3,null",
    b"1,2,3,18446744073709551616",  # beyond uint64
])
def test_a_bad_new_part_is_refused_and_the_reader_keeps_what_it_knew(span: bytes) -> None:
    reader = PromptIdsReader()
    assert reader.read(b"1,2,3").tolist() == [1, 2, 3]
    assert reader.read(span) is None
    assert reader.read(b"1,2,3,9").tolist() == [1, 2, 3, 9]  # still extends the last good prompt


def test_the_reader_only_reuses_at_an_id_boundary_and_keeps_an_auxiliary_prompt_apart() -> None:
    reader = PromptIdsReader()
    assert reader.read(b"1,2,3").tolist() == [1, 2, 3]
    assert reader.read(b"1,2,34,5").tolist() == [1, 2, 34, 5]  # "1,2,3" is a text prefix, not an id prefix
    assert reader.read(b"1,2,3,6").tolist() == [1, 2, 3, 6]
    assert reader.read(b"9,9").tolist() == [9, 9]  # an auxiliary call (a title) in the same session
    assert reader.read(b"1,2,3,6,7,8").tolist() == [1, 2, 3, 6, 7, 8]  # the main chain goes on
    assert reader.read(b"9,9,1").tolist() == [9, 9, 1]
    assert reader.read(b"").tolist() == []


def test_split_leaves_the_span_unread_for_the_reader() -> None:
    raw = orjson.dumps(_reply([5, 6, 7]))
    reply, span = split_chat_reply(raw)
    assert span == b"5,6,7" and reply is not None and reply["prompt_token_ids"] is None
    odd = raw.replace(b"[5,6,7]", b"[5,-6,7]")
    reply, span = split_chat_reply(odd)  # not checked here: the reader refuses it, the full parse keeps it
    assert span == b"5,-6,7" and PromptIdsReader().read(span) is None
    assert parse_chat_reply(odd)[0]["prompt_token_ids"] == [5, -6, 7]


def _nested_raw(top: bytes, nested_key: bytes = b'"prompt_token_ids"') -> bytes:
    """A reply whose top-level prompt ids are ``top`` (raw JSON) and which carries the key again,
    with ids, inside ``kv_transfer_params`` -- and no usage block that could contradict them."""
    return (b'{"id":"c","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop",'
            b'"token_ids":[7],"message":{"role":"assistant","content":"x"},'
            b'"logprobs":{"content":[{"token":"t","logprob":-0.5}]}}],'
            b'"prompt_token_ids":' + top + b',"kv_transfer_params":{' + nested_key + b':[11,12,13]}}')


@pytest.mark.parametrize("raw", [
    _nested_raw(b"null"),  # top level null, nested ids: the nested list is not the prompt
    _nested_raw(b"null").replace(b'"prompt_token_ids":null', b'"prompt_token_ids": null'),
    # the top-level key spelled with an escape: only a full parse sees it is the same key
    _nested_raw(b"null").replace(b'"prompt_token_ids":null', b'"prompt\\u005ftoken_ids":null'),
    # the top-level key absent altogether
    _nested_raw(b"null").replace(b'"prompt_token_ids":null,', b""),
])
def test_a_nested_prompt_token_ids_is_never_taken_for_the_prompt(raw: bytes) -> None:
    full = orjson.loads(raw)
    assert full.get("prompt_token_ids") is None and full["kv_transfer_params"]["prompt_token_ids"] == [11, 12, 13]
    reply, span = split_chat_reply(raw)
    assert span is None and reply == full  # the full parse, untouched
    reply, ids = parse_chat_reply(raw)
    assert ids is None and reply == full
    ev = extract_evidence(reply, ids)
    assert not ev.valid and "engine returned no prompt_token_ids" in ev.reasons
    assert PromptIdsReader().take(_upstream(raw)) is None


@pytest.mark.parametrize("raw, doubt", [
    (b'{"choices":[],"prompt_token_ids":[1,2],"prompt_token_ids":null}', "prompt_token_ids"),
    (b'{"choices":[],"prompt_token_ids":null,"prompt_token_ids":[1,2]}', "prompt_token_ids"),
    (b'{"choices":[{"token_ids":[9],"token_ids":[7]}],"prompt_token_ids":[1,2]}', "token_ids"),
    (b'{"choices":[{"token_ids":[7]}],"prompt_token_ids":[1,2],"kv_transfer_params":{"token_ids":[3]}}', None),
    (b'{"choices":[{"token_ids":[7]}],"prompt_token_ids":[1,2],"kv_transfer_params":{"prompt_token_ids":[3]}}', None),
    (_nested_raw(b"[4,5]"), None),  # nested once, top level once: not a duplicate
])
def test_a_token_key_given_twice_in_one_object_is_a_doubt(raw: bytes, doubt: str | None) -> None:
    reply = _upstream(raw)
    assert reply.doubts == ([f"the reply gives {doubt} more than once in one object"] if doubt else [])


def test_duplicated_top_level_keys_are_read_as_the_full_parse_reads_them() -> None:
    # JSON parsers keep the last of duplicated keys: the fast reader must never pick another one
    first_ids = b'{"choices":[],"prompt_token_ids":[1,2],"prompt_token_ids":null}'
    reply, span = split_chat_reply(first_ids)
    assert span is None and reply == orjson.loads(first_ids) and reply["prompt_token_ids"] is None
    last_ids = b'{"choices":[],"prompt_token_ids":null,"prompt_token_ids":[1,2]}'
    reply, span = split_chat_reply(last_ids)
    assert span is None and reply == orjson.loads(last_ids) and reply["prompt_token_ids"] == [1, 2]


def _upstream(raw: bytes):
    from openenv_harness.recorder.upstream.base import UpstreamReply
    from openenv_harness.recorder.upstream.reply_parse import parse_engine_reply

    parsed, span, doubts = parse_engine_reply(raw, status=200, chat=True)
    return UpstreamReply(status=200, json=parsed, prompt_span=span, body=raw, doubts=doubts)


def test_the_httpx_transport_reads_a_nested_key_as_the_full_parse_does() -> None:
    """Every transport cuts the span with the same function; the httpx one, end to end."""
    import asyncio

    import httpx

    from openenv_harness.recorder.upstream.http import HTTPEngine

    raw = _nested_raw(b"null")
    engine = HTTPEngine("http://engine.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=raw, headers={"content-type": "application/json"})))

    async def one() -> object:
        await engine.start()
        try:
            return await engine.chat({"messages": []}, session_id="s")
        finally:
            await engine.aclose()

    reply = asyncio.run(one())
    assert reply.prompt_span is None and reply.json == orjson.loads(raw)
