"""Call digests: bounded for very long prompts, faithful to the record, never decoding anything."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from openenv_harness.contract import loss_mask_for
from openenv_harness.viewer.digest import (
    MAX_SLICE,
    MAX_TEXT,
    DigestOptions,
    call_digest,
    logprob_stats,
    message_view,
    prompt_windows,
    token_slice,
)


def record(prompt: list[int], completion: list[int], *, fidelity: dict[str, Any] | None = None,
           trainable: bool = True, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {
        "request": {"messages": [{"role": "user", "content": f"m{i}"} for i in range(6)]},
        "response": {"choices": [{"message": {
            "role": "assistant", "content": "hi",
            "tool_calls": [{"id": "c1", "function": {"name": "bash", "arguments": "{}"}}]}}]},
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "per_token_logps": [-0.5] * len(completion),
        "loss_mask": loss_mask_for(len(prompt), len(completion), trainable),
        "metadata": {"node_id": "s/3", "session_id": "s", "call_index": 3, "seq": 9, "status": status,
                     "trainable": trainable, "fidelity": fidelity, "policy_version_start": 2, "policy_version_end": 3,
                     "straddled_sync": True, "limits": {"stop": "max_total_tokens"}},
        **extra,
    }


def test_a_long_prompt_ships_only_its_windows() -> None:
    prompt = list(range(50_000))
    entry = record(prompt, [7, 8, 9], fidelity={"class": "replay_drift", "parent": "s/2", "divergence_at": 20_000,
                                                 "drift_tokens": 30_000})
    digest = call_digest(entry, DigestOptions(tail=128, around=32))
    windows = [(w["start"], len(w["ids"])) for w in digest["prompt_windows"]]
    assert windows == [(19_968, 64), (49_872, 128)]
    for window in digest["prompt_windows"]:
        assert window["ids"] == prompt[window["start"]: window["start"] + len(window["ids"])]
    assert digest["prompt_len"] == 50_000
    assert len(orjson.dumps(digest)) < 4_000  # 50k ids in the record, a few hundred bytes of them on the wire


def test_windows_merge_and_clamp() -> None:
    assert prompt_windows(100, 95, tail=10, around=8) == [(87, 100)]  # divergence inside the tail: one span
    assert prompt_windows(100, 0, tail=10, around=8) == [(0, 8), (90, 100)]
    assert prompt_windows(100, 100, tail=0, around=8) == [(92, 100)]  # divergence at the very end
    assert prompt_windows(100, None, tail=500, around=8) == [(0, 100)]
    assert prompt_windows(0, None, tail=10, around=8) == []
    assert prompt_windows(100, 150, tail=0, around=8) == []  # out-of-range divergence is ignored


def test_digest_is_faithful_to_the_record() -> None:
    exact = {"class": "exact", "parent": "s/2", "divergence_at": None, "drift_tokens": 0}
    entry = record([1, 2, 3], [4, 5], fidelity=exact)
    digest = call_digest(entry, DigestOptions(messages=2))
    assert digest["node_id"] == "s/3" and digest["call_index"] == 3 and digest["seq"] == 9
    assert digest["fidelity"]["class"] == "exact" and digest["fidelity"]["parent"] == "s/2"
    assert digest["messages_total"] == 6 and [m["content"] for m in digest["messages"]] == ["m4", "m5"]
    assert digest["response"]["tool_calls"] == [{"id": "c1", "name": "bash", "arguments": "{}", "truncated": False}]
    assert digest["completion_ids"] == [4, 5] and digest["completion_mask"] == [1, 1]
    assert digest["prompt_mask_nonzero"] == 0
    assert (digest["policy_version_start"], digest["policy_version_end"], digest["straddled_sync"]) == (2, 3, True)
    assert digest["limits"]["stop"] == "max_total_tokens"


def test_untrainable_and_odd_masks() -> None:
    untrained = call_digest(record([1, 2], [3, 4], trainable=False, status="invalid"))
    assert untrained["completion_mask"] == [0, 0] and untrained["trainable"] is False
    broken = record([1, 2], [3, 4])
    broken["loss_mask"] = [1, 0, 1, 1]  # a mask that trains a prompt position is shown, not hidden
    assert call_digest(broken)["prompt_mask_nonzero"] == 1
    short = record([1, 2], [3, 4])
    short["loss_mask"] = [0]  # misaligned: nothing is claimed trainable
    assert call_digest(short)["completion_mask"] == [0, 0]


def test_completion_token_strings_stand_in_for_missing_ids() -> None:
    entry = record([1, 2], [], completion_tokens=["token_id:11", "token_id:12"])
    entry["per_token_logps"] = [-1.0, -2.0]
    digest = call_digest(entry)
    assert digest["completion_len"] == 2 and digest["completion_tokens"] == ["token_id:11", "token_id:12"]
    assert token_slice(entry, "completion", 1, 5)["tokens"] == ["token_id:12"]


def test_long_completions_are_cut_and_sliced() -> None:
    entry = record([1], list(range(5000)))
    digest = call_digest(entry, DigestOptions(completion=100))
    assert digest["completion_len"] == 5000 and digest["completion_ids"] == list(range(100))
    piece = token_slice(entry, "completion", 100, 300)
    assert piece["ids"] == list(range(100, 300)) and piece["mask"] == [1] * 200 and len(piece["logps"]) == 200


def test_failed_call_digest() -> None:
    error = {"kind": "engine_500", "status": 500, "upstream_status": 500, "message": "engine: boom",
             "upstream_body": {"error": {"message": "boom"}}}
    entry = {"request": {"messages": []}, "response": {}, "prompt_token_ids": [], "completion_token_ids": [],
             "per_token_logps": [], "loss_mask": [], "metadata": {"node_id": "s/0", "status": "failed", "error": error}}
    digest = call_digest(entry)
    assert digest["error"] == error and digest["response"] is None and digest["prompt_windows"] == []
    assert digest["logprobs"] == {"count": 0, "finite": 0, "mean": None, "min": None}


def test_message_view_handles_parts_reasoning_and_long_text() -> None:
    view = message_view({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, "b"]})
    assert view["content"] == "a[image_url]b"
    long = message_view({"role": "assistant", "content": "x" * (MAX_TEXT + 10), "reasoning_content": "think"})
    assert len(long["content"]) == MAX_TEXT and long["truncated"] and long["reasoning"] == "think"
    tool = message_view({"role": "tool", "tool_call_id": "c9", "content": None})
    assert tool["content"] == "" and tool["tool_call_id"] == "c9"
    assert message_view("not a message")["role"] == "?"


def test_logprob_stats_skip_non_finite_values() -> None:
    stats = logprob_stats([-1.0, -3.0, float("nan"), float("-inf")])
    assert stats == {"count": 4, "finite": 2, "mean": -2.0, "min": -3.0}
    assert math.isclose(logprob_stats([-0.1] * 3)["mean"], -0.1)
    assert logprob_stats([])["mean"] is None


@pytest.mark.parametrize("start, stop, says", [(5, 5, "start < stop"), (-1, 3, "start < stop"),
                                               (0, MAX_SLICE + 1, "at most")])
def test_bad_slices_are_refused(start: int, stop: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        token_slice(record([1, 2], [3]), "prompt", start, stop)
