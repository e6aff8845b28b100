"""What an accepted agent body may hold (``request_body.py``), over real HTTP: nesting is bounded with
a 400, integers are forwarded exactly or refused, ``n`` means one sample -- and no refused body
uses a call number."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.edge.request_body import MAX_JSON_DEPTH_LIMIT
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, tool_script

MESSAGES = b'[{"role":"user","content":"x"}]'


def nested(levels: int) -> bytes:
    """A chat body whose ``metadata`` field makes it ``levels`` deep (the body itself is level 1)."""
    inner = b"0"
    for _ in range(levels - 1):
        inner = b'{"a":' + inner + b"}"
    return b'{"model":"reference-model","messages":' + MESSAGES + b',"metadata":' + inner + b"}"


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def post(s: dict[str, Any], body: bytes) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", content=body, timeout=30,
                      headers={"authorization": f"Bearer {s['secret']}", "content-type": "application/json"})


@pytest.fixture
def session(recorder: RecorderServer, engine: EngineServer, admin: RecorderClient) -> dict[str, Any]:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    return s


def test_the_nesting_helper_nests_as_named() -> None:
    assert depth(orjson.loads(nested(64))) == 64 and depth(orjson.loads(nested(300))) == 300


@pytest.mark.parametrize("levels", [65, 300, 1000])
def test_deeply_nested_bodies_get_a_400_and_use_no_call_number(
        levels: int, session: dict[str, Any], engine: EngineServer, admin: RecorderClient) -> None:
    r = post(session, nested(levels))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_deeply_nested" and "64 levels" in r.json()["error"]["message"]
    assert engine.requests(session["session_id"]) == []
    ok = post(session, nested(64))  # the deepest accepted body is forwarded and recorded unchanged
    assert ok.status_code == 200, ok.text
    (record,) = admin.records(session["session_id"])
    assert record["metadata"]["call_index"] == 0 and depth(record["request"]) == 64
    assert orjson.loads(nested(64)) == record["request"]


def test_the_depth_bound_is_configurable(tmp_path: Any, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            max_json_depth=8)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], tool_script(0, final="ok"))
        assert post(s, nested(9)).json()["error"]["code"] == "too_deeply_nested"
        assert post(s, nested(8)).status_code == 200
    with pytest.raises(ValueError):  # past what a record can hold and still be serialized
        RecorderConfig(store_path="x", max_json_depth=MAX_JSON_DEPTH_LIMIT + 1)


@pytest.mark.parametrize("literal", [b"123456789012345678901234567890", b"18446744073709551616",
                                     b"-9223372036854775809", b"-123456789012345678901234567890",
                                     b"7" * 400])  # past a double's range too: orjson refuses it outright
def test_integers_beyond_64_bits_are_refused_never_turned_into_floats(
        literal: bytes, session: dict[str, Any], engine: EngineServer, admin: RecorderClient) -> None:
    body = b'{"model":"reference-model","messages":' + MESSAGES + b',"seed":' + literal + b"}"
    r = post(session, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "integer_out_of_range" and "64-bit" in r.json()["error"]["message"]
    nested_in_tools = (b'{"model":"reference-model","messages":' + MESSAGES
                       + b',"tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":'
                       + literal + b"}}}]}")
    assert post(session, nested_in_tools).json()["error"]["code"] == "integer_out_of_range"
    assert engine.requests(session["session_id"]) == [] and admin.records(session["session_id"]) == []


def test_integers_within_64_bits_and_large_floats_are_forwarded_exactly(
        session: dict[str, Any], engine: EngineServer, admin: RecorderClient) -> None:
    body = (b'{"model":"reference-model","messages":' + MESSAGES + b',"seed":18446744073709551615,'
            b'"metadata":{"low":-9223372036854775808,"big_float":1e30,"ids":"123456789012345678901234567890"}}')
    r = post(session, body)
    assert r.status_code == 200, r.text
    (sent,) = engine.requests(session["session_id"])
    assert sent["body"]["seed"] == 18446744073709551615 and type(sent["body"]["seed"]) is int
    assert sent["body"]["metadata"] == {"low": -9223372036854775808, "big_float": 1e30,
                                        "ids": "123456789012345678901234567890"}
    (record,) = admin.records(session["session_id"])
    assert record["request"]["seed"] == 18446744073709551615


@pytest.mark.parametrize("n", [b"true", b"1.0", b"false", b'"1"', b"2", b"0", b"[1]"])
def test_n_must_be_the_integer_one(n: bytes, session: dict[str, Any], engine: EngineServer) -> None:
    r = post(session, b'{"model":"reference-model","messages":' + MESSAGES + b',"n":' + n + b"}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_n", r.text
    assert engine.requests(session["session_id"]) == []


@pytest.mark.parametrize("n", [b"1", b"null"])
def test_n_one_or_absent_is_served(n: bytes, session: dict[str, Any]) -> None:
    assert post(session, b'{"model":"reference-model","messages":' + MESSAGES + b',"n":' + n + b"}").status_code == 200


@pytest.mark.parametrize("literal", [b"1e400", b"-2E+999", b"1" + b"0" * 400 + b".5"])
def test_numbers_beyond_a_double_are_named_not_called_invalid_json(
        literal: bytes, session: dict[str, Any], engine: EngineServer) -> None:
    r = post(session, b'{"model":"reference-model","messages":' + MESSAGES + b',"temperature":' + literal + b"}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "number_out_of_range", r.text
    assert engine.requests(session["session_id"]) == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FRESH = itertools.count()


def _fits(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, dict):
            return all(_fits(v) for v in value.values())
        if isinstance(value, list):
            return all(_fits(v) for v in value)
        return True
    return -(2**63) <= value < 2**64


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.dictionaries(st.text(alphabet="abcdefgh", min_size=1, max_size=6).map(lambda k: "x_" + k), _JSON,
                             max_size=4))
def test_the_agents_body_reaches_the_engine_unaltered_or_is_refused(
        extra: dict[str, Any], session: dict[str, Any], engine: EngineServer) -> None:
    """Any JSON an agent adds to its body reaches the engine exactly as sent (types included), or --
    when it holds an integer no 64-bit type can keep -- is refused before the engine sees it."""
    content = f"fresh {next(_FRESH)}"
    body = {"model": "reference-model", "messages": [{"role": "user", "content": content}], **extra}
    r = post(session, json.dumps(body).encode())  # the standard library writes big integers exactly
    last = (engine.requests(session["session_id"]) or [{"body": {}}])[-1]["body"]
    reached = last.get("messages", [{}])[0].get("content") == content
    if not _fits(extra):
        assert r.status_code == 400 and r.json()["error"]["code"] == "integer_out_of_range", r.text
        assert not reached
        return
    assert r.status_code == 200 and reached, r.text
    sent = last
    assert {k: sent[k] for k in extra} == extra
    assert json.dumps({k: sent[k] for k in extra}, sort_keys=True) == json.dumps(extra, sort_keys=True)  # types too


async def _receive_from(messages: list[dict]) -> tuple[object, list[dict]]:
    taken: list[dict] = []

    async def receive() -> dict:
        message = messages.pop(0)
        taken.append(message)
        return message

    return receive, taken


async def test_the_edge_reader_joins_a_body_and_refuses_one_past_the_limit_without_reading_on() -> None:
    from openenv_harness.recorder.edge.request_body import ClientGone, receive_body

    receive, _ = await _receive_from([{"type": "http.request", "body": b"ab", "more_body": True},
                                      {"type": "http.request", "body": b"cd", "more_body": False}])
    assert await receive_body(receive, "4", 4) == b"abcd"
    with pytest.raises(AgentError) as declared:  # refused from its declared length, nothing read
        await receive_body(receive, "5", 4)
    assert (declared.value.status, declared.value.code) == (413, "body_too_large")
    chunks = [{"type": "http.request", "body": b"x" * 3, "more_body": True} for _ in range(5)]
    receive, taken = await _receive_from(chunks)
    with pytest.raises(AgentError):
        await receive_body(receive, None, 4)  # no length declared: refused once past the limit
    assert len(taken) == 2
    receive, _ = await _receive_from([{"type": "http.disconnect"}])
    with pytest.raises(ClientGone):
        await receive_body(receive, None, 4)
