"""The reply-shape comparison: keys and JSON types count, values do not."""

from __future__ import annotations

import pytest

from openenv_harness.testing.shapes import (
    assert_same_shape,
    assert_same_stream_shape,
    chunk_sequence,
    json_shape,
    shape_diff,
)

REAL = {"id": "a", "choices": [{"index": 0, "stop_reason": None, "token_ids": [1, 2]}], "usage": {"n": 3},
        "metrics": None}


def test_values_do_not_count() -> None:
    other = {"id": "zzz", "choices": [{"index": 7, "stop_reason": None, "token_ids": [9]}], "usage": {"n": 0},
             "metrics": None}
    assert_same_shape(REAL, other, "reply")


def test_list_items_fold_into_one_path() -> None:
    assert json_shape({"a": [{"x": 1}, {"y": "s"}]}) == {("$", "object"), ("$.a", "array"), ("$.a[]", "object"),
                                                         ("$.a[].x", "int"), ("$.a[].y", "string")}


def test_every_difference_is_reported_with_its_path() -> None:
    reference = {"id": "a", "choices": [{"index": 0, "stop_reason": "x", "token_ids": [1.0]}], "usage": {"n": 3},
                 "extra": True}
    with pytest.raises(AssertionError) as failure:
        assert_same_shape(REAL, reference, "chat reply")
    message = str(failure.value)
    assert "chat reply: the replies differ in shape (4 paths)" in message
    assert "$.choices[].stop_reason   real: null   reference: string" in message
    assert "$.choices[].token_ids[]   real: int   reference: float" in message
    assert "$.metrics   real: null   reference: (absent)" in message
    assert "$.extra   real: (absent)   reference: bool" in message


def test_an_empty_list_differs_from_a_filled_one_and_ignore_skips_a_subtree() -> None:
    assert shape_diff(json_shape({"c": []}), json_shape({"c": [1]})) == ["$.c[]   real: (absent)   reference: int"]
    assert shape_diff(json_shape({"c": [], "k": 1}), json_shape({"c": [{"a": 1}], "k": 1}), ignore=["$.c"]) == []


def _chunk(delta: dict, finish: str | None = None, **extra) -> dict:
    return {"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


STREAM = [_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]), _chunk({"content": "Hi"}),
          _chunk({"content": " there"}), _chunk({}, "stop"), {"id": "x", "choices": [], "usage": {"n": 1}}, "[DONE]"]


def test_streams_compare_by_kind_not_by_length() -> None:
    shorter = [STREAM[0], STREAM[1], STREAM[3], STREAM[4], "[DONE]"]
    assert chunk_sequence(STREAM) == ["first", "token", "finish", "usage"]
    assert_same_stream_shape(STREAM, shorter, "stream")


def test_stream_differences_name_the_kind() -> None:
    head = _chunk({"content": None, "tool_calls": [{"id": "t", "index": 0, "function": {"name": "f",
                                                                                        "arguments": ""}}]})
    other = [STREAM[0], head, STREAM[3], STREAM[4], "[DONE]"]
    with pytest.raises(AssertionError) as failure:
        assert_same_stream_shape(STREAM, other, "stream")
    message = str(failure.value)
    assert "delta:content occurs only in the real stream" in message
    assert "delta:tool_head occurs only in the reference stream" in message
    with pytest.raises(AssertionError, match="chunk order   real: first, token, finish, usage   reference: first, "
                                             "token, finish"):
        assert_same_stream_shape(STREAM, STREAM[:4] + ["[DONE]"], "stream")
    with pytest.raises(AssertionError, match=r"must end with data: \[DONE\]"):
        assert_same_stream_shape(STREAM, STREAM[:-1], "stream")
