"""The SGLang checker can fail: it accepts SGLang-shaped payloads and refuses wrong types, unknown keys,
missing keys and vLLM's shapes, judged by SGLang 0.5.23's own classes and source."""

from __future__ import annotations

from typing import Any

import pytest

from openenv_harness.testing.sglang_models import SGLANG_ROUTE_KINDS, SGLangModelsUnavailable, check_sglang_payloads

META = {"id": "r1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3, "weight_version": "default",
        "num_retractions": 0, "input_token_logprobs": [], "output_token_logprobs": [[-0.5, 7, None], [-0.1, 2, None]],
        "output_token_logprobs_length": 2, "reasoning_tokens": 0, "completion_tokens": 2, "cached_tokens": 0,
        "weight_versions": [{"version": "default", "start": 0, "end": 2}], "e2e_latency": 0.01}
GENERATE = {"text": "x", "output_ids": [7, 2], "meta_info": META}
CHAT = {"id": "r1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x", "reasoning_content": None},
                     "logprobs": None, "finish_reason": "stop", "matched_stop": 2, "response_token_ids": [7, 2],
                     "prompt_token_ids": [1, 2, 3]}],
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None,
                  "reasoning_tokens": 0, "completion_tokens_details": None},
        "metadata": {"weight_version": "default", "weight_versions": [{"version": "default", "start": 0, "end": 2}]}}

CASES: list[tuple[str, str, Any, str]] = [
    # (name, kind, payload, expected: "ok" | "error" | "unknown" | "missing")
    ("chat request", "chat_request", {"messages": [{"role": "user", "content": "hi"}], "return_meta_info": True}, "ok"),
    ("chat request, messages not a list", "chat_request", {"messages": "hi"}, "error"),
    ("chat request, invented key", "chat_request", {"messages": [], "return_everything": True}, "unknown"),
    ("chat reply", "chat_response", CHAT, "ok"),
    ("chat reply with vLLM's keys", "chat_response",
     {**CHAT, "prompt_token_ids": [1], "choices": [{**CHAT["choices"][0], "token_ids": [7, 2]}]}, "unknown"),
    ("chat reply without usage's reasoning_tokens", "chat_response",
     {**CHAT, "usage": {k: v for k, v in CHAT["usage"].items() if k != "reasoning_tokens"}}, "missing"),
    ("chat reply, logprobs as a number", "chat_response", {**CHAT, "choices": [{**CHAT["choices"][0], "logprobs": 3}]},
     "error"),
    ("generate request", "generate_request", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4},
                                              "return_logprob": True, "rid": "a"}, "ok"),
    ("generate request, vLLM's max_tokens", "generate_request", {"input_ids": [1], "sampling_params": {"max_tokens": 4}},
     "error"),
    ("generate request, ids as a string", "generate_request", {"input_ids": "1 2"}, "error"),
    ("generate reply", "generate_response", GENERATE, "ok"),
    ("generate reply, logprob pairs", "generate_response",
     {**GENERATE, "meta_info": {**META, "output_token_logprobs": [[-0.5, 7], [-0.1, 2]]}}, "error"),
    ("generate reply, logprob ids not the output", "generate_response",
     {**GENERATE, "meta_info": {**META, "output_token_logprobs": [[-0.5, 8, None], [-0.1, 2, None]]}}, "error"),
    ("generate reply, invented meta key", "generate_response", {**GENERATE, "meta_info": {**META, "sampled_by": "x"}},
     "unknown"),
    ("generate reply without spans", "generate_response",
     {**GENERATE, "meta_info": {k: v for k, v in META.items() if k != "weight_versions"}}, "missing"),
    ("tokenize reply", "tokenize_response", {"tokens": [1, 2], "count": 2, "max_model_len": 10}, "ok"),
    ("tokenize reply, vLLM's token_strs", "tokenize_response",
     {"tokens": [1], "count": 1, "max_model_len": 10, "token_strs": None}, "unknown"),
    ("detokenize reply, vLLM's prompt", "detokenize_response", {"prompt": "x"}, "error"),
    ("pause, unknown mode", "pause_generation_request", {"mode": "keep"}, "error"),
    ("pause", "pause_generation_request", {"mode": "in_place"}, "ok"),
    ("weights from disk, no path", "update_weights_from_disk_request", {"weight_version": "v"}, "error"),
    ("weights from disk, invented key", "update_weights_from_disk_request", {"model_path": "/m", "reload": 1}, "unknown"),
    ("weights reply, success as a list", "update_weights_from_disk_response",
     {"success": [], "message": "", "num_paused_requests": 0}, "error"),
    ("version, number", "update_weight_version_request", {"new_version": 3}, "error"),
    ("parse_function_call reply", "parse_function_call_response",
     {"normal_text": "", "calls": [{"tool_index": 0, "name": "bash", "parameters": "{}"}]}, "ok"),
    ("parse_function_call reply, arguments", "parse_function_call_response",
     {"normal_text": "", "calls": [{"tool_index": 0, "name": "bash", "parameters": "{}", "arguments": "{}"}]}, "unknown"),
    ("separate_reasoning request, no parser", "separate_reasoning_request", {"text": "x"}, "error"),
]


@pytest.fixture(scope="module")
def verdicts() -> list[dict[str, Any]]:
    try:
        return check_sglang_payloads([{"kind": kind, "payload": payload} for _n, kind, payload, _e in CASES])
    except SGLangModelsUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.slow  # SGLang's own classes are imported from its sources in the engine venv (~20 s of CPU)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_verdict(verdicts: list[dict[str, Any]], index: int) -> None:
    _name, kind, _payload, expected = CASES[index]
    verdict = verdicts[index]
    assert verdict["kind"] == kind
    got = ("error" if not verdict["ok"] else "unknown" if verdict["unknown"] else "missing" if verdict["missing"]
           else "ok")
    assert got == expected, verdict


def test_every_route_names_known_kinds() -> None:
    kinds = {kind for pair in SGLANG_ROUTE_KINDS.values() for kind in pair if kind is not None}
    assert {"chat_request", "chat_response", "generate_request", "generate_response", "pause_generation_request",
            "continue_generation_request", "update_weights_from_disk_request", "update_weight_version_request",
            "parse_function_call_request", "separate_reasoning_request", "tokenize_request", "tokenize_response",
            "detokenize_request", "detokenize_response"} <= kinds
