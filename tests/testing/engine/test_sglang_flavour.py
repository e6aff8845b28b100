"""The reference engine's SGLang flavour held to SGLang 0.5.23's own classes, and to token exactness.

One engine (``EngineConfig(family="sglang")``) is driven over every SGLang route the recorder may call --
chat with scripted tool calls and reasoning, generate from ids, tokenize / detokenize, the parsers, the
three pause modes, weight updates that succeed and fail, version changes, cache flushes --; every request
sent and every reply received is validated by SGLang's classes in one checker run
(``openenv_harness.testing.sglang_models``), with no key SGLang does not declare and none it would write
missing.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn
from openenv_harness.testing.sglang_models import SGLANG_ROUTE_KINDS, SGLangModelsUnavailable, check_sglang_payloads

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "list the files"}]
SCRIPT = Script(turns=[Turn(reasoning="I should look.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])],
                final_text="The folder holds one file.", aux_text="A summary of the tool run, " * 12)


class Driver:
    """Posts to the engine and keeps each exchange for the checker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.exchanges: list[dict[str, Any]] = []

    def post(self, path: str, body: dict[str, Any], status: int = 200) -> Any:
        reply = httpx.post(self.url + path, json=body, timeout=60)
        assert reply.status_code == status, (path, reply.status_code, reply.text)
        payload = reply.json() if reply.headers.get("content-type") == "application/json" else reply.text
        self.exchanges.append({"path": path, "request": body, "reply": payload, "status": reply.status_code})
        return payload


def _until_decoding(engine: EngineServer, timeout_s: float = 30.0) -> None:
    """Until a request in flight has emitted a token: the pause then straddles it on a loaded machine too."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(gen.emitted >= 1 for gen, _slot in list(engine.app.state.sglang.running.values())):
            return
        time.sleep(0.005)
    raise AssertionError(f"no request was decoding within {timeout_s} s")


def _pause_straddle(driver: Driver, engine: EngineServer, mode: str, body: dict[str, Any],
                    path: str = "/generate") -> dict[str, Any]:
    """A request in flight across ``/pause_generation {mode}``; for the freezing modes the weight version
    changes while paused, then generation continues. The request's reply."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(driver.post, path, body)
        _until_decoding(engine)
        driver.post("/pause_generation", {"mode": mode})
        if mode != "abort":
            time.sleep(0.2)
            assert not future.done(), f"{mode} froze nothing"
            driver.post("/update_weight_version", {"new_version": f"after-{mode}", "abort_all_requests": False})
        driver.post("/continue_generation", {})
        reply: dict[str, Any] = future.result(timeout=60)
        return reply


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    weights = tmp_path_factory.mktemp("weights")
    (weights / "model.safetensors").write_bytes(b"\0" * 8)
    out: dict[str, Any] = {"weights": str(weights)}
    with EngineServer(EngineConfig(family="sglang", decode_delay_s=0.02)) as engine:
        engine.set_script("*", SCRIPT)
        d = Driver(engine.url)
        chat = {"model": "reference-model", "messages": MESSAGES, "tools": TOOLS, "return_prompt_token_ids": True,
                "return_token_ids": True, "return_meta_info": True, "logprobs": True, "top_logprobs": 2, "seed": 11,
                "max_completion_tokens": 200, "rid": "chat-1"}
        out["chat"] = d.post("/v1/chat/completions", chat)
        out["tokenized"] = d.post("/v1/tokenize", {"messages": MESSAGES, "tools": TOOLS, "add_generation_prompt": True})
        d.post("/tokenize", {"prompt": "hello world"})
        prompt_ids = out["chat"]["choices"][0]["prompt_token_ids"]
        generate = {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 200, "temperature": 1.0,
                                                                 "sampling_seed": 11, "skip_special_tokens": True},
                    "return_logprob": True, "top_logprobs_num": 2, "rid": "gen-1"}
        out["generate"] = d.post("/generate", generate)
        out["text"] = d.post("/v1/detokenize", {"tokens": out["generate"]["output_ids"]})
        d.post("/detokenize", {"tokens": [prompt_ids[:3], prompt_ids[3:6]], "skip_special_tokens": False})
        out["calls"] = d.post("/parse_function_call", {"text": out["generate"]["text"].split("</think>")[-1],
                                                       "tools": TOOLS, "tool_call_parser": "qwen25"})
        out["reasoning"] = d.post("/separate_reasoning", {"text": out["generate"]["text"], "reasoning_parser": "qwen3"})
        plain = {"input_ids": prompt_ids[:-3], "sampling_params": {"max_new_tokens": 64}}
        out["abort"] = _pause_straddle(d, engine, "abort", {"messages": MESSAGES, "max_tokens": 64, "return_meta_info": True},
                                       "/v1/chat/completions")
        out["in_place"] = _pause_straddle(d, engine, "in_place", plain)
        out["retract"] = _pause_straddle(d, engine, "retract", plain)
        out["failed"] = d.post("/update_weights_from_disk", {"model_path": str(weights / "missing")}, 400)
        out["loaded"] = d.post("/update_weights_from_disk", {"model_path": str(weights), "weight_version": "step-1",
                                                             "flush_cache": True, "abort_all_requests": False})
        out["after"] = d.post("/generate", {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 8}})
        out["version"] = d.post("/update_weight_version", {"new_version": "step-2"})
        out["flush"] = httpx.post(engine.url + "/flush_cache", timeout=30)
        out["model_info"] = httpx.get(engine.url + "/model_info", timeout=30).json()
        out["server_info"] = httpx.get(engine.url + "/server_info", timeout=30).json()
        out["vllm_routes"] = {p: httpx.post(engine.url + p, json={}, timeout=30).status_code for p in (
            "/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender", "/pause",
            "/resume", "/collective_rpc", "/reset_prefix_cache")}
        out["vllm_routes"].update({p: httpx.get(engine.url + p, timeout=30).status_code for p in ("/weight_info", "/version")})
        out["received"] = engine.requests()
        out["exchanges"] = d.exchanges
    return out


def _check(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return check_sglang_payloads(items)
    except SGLangModelsUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.slow  # SGLang's own classes are imported from its sources in the engine venv (~20 s of CPU)
def test_every_request_and_reply_conforms_to_sglangs_classes(run: dict[str, Any]) -> None:
    items, where = [], []
    for exchange in run["exchanges"]:
        request_kind, reply_kind = SGLANG_ROUTE_KINDS[exchange["path"]]
        items.append({"kind": request_kind, "payload": exchange["request"]})
        where.append((exchange["path"], "request"))
        if reply_kind is not None:
            items.append({"kind": reply_kind, "payload": exchange["reply"]})
            where.append((exchange["path"], "reply"))
    assert {e["path"] for e in run["exchanges"]} == set(SGLANG_ROUTE_KINDS)  # every route driven
    verdicts = _check(items)
    bad = [(w, v) for w, v in zip(where, verdicts) if not v["ok"] or v["unknown"] or v["missing"]]
    assert not bad, bad


def test_chat_prompt_ids_are_tokenizes_and_outputs_are_the_logprob_ids(run: dict[str, Any]) -> None:
    choice = run["chat"]["choices"][0]
    assert choice["prompt_token_ids"] == run["tokenized"]["tokens"]
    assert run["tokenized"]["count"] == len(choice["prompt_token_ids"])
    meta = choice["meta_info"]
    assert [entry[1] for entry in meta["output_token_logprobs"]] == choice["response_token_ids"]
    assert all(isinstance(entry[2], str) for entry in meta["output_token_logprobs"])  # chat decodes the texts
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [e[0] for e in meta["output_token_logprobs"]]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert choice["message"]["reasoning_content"] == "I should look."
    assert meta["id"] == run["chat"]["id"] == "chat-1"
    assert run["chat"]["metadata"] == {"weight_version": "default",
                                       "weight_versions": [{"version": "default", "start": 0,
                                                            "end": len(choice["response_token_ids"])}]}
    assert "prompt_token_ids" not in run["chat"] and "token_ids" not in choice  # no vLLM keys


def test_generate_from_the_chats_prompt_ids_samples_the_same_ids(run: dict[str, Any]) -> None:
    choice, generated = run["chat"]["choices"][0], run["generate"]
    assert generated["output_ids"] == choice["response_token_ids"]
    meta = generated["meta_info"]
    assert [e[1] for e in meta["output_token_logprobs"]] == generated["output_ids"]
    assert [e[0] for e in meta["output_token_logprobs"]] == [e[0] for e in choice["meta_info"]["output_token_logprobs"]]
    assert all(e[2] is None for e in meta["output_token_logprobs"])  # no return_text_in_logprobs
    assert meta["finish_reason"] == {"type": "stop", "matched": generated["output_ids"][-1]}
    assert meta["id"] == "gen-1" and meta["completion_tokens"] == len(generated["output_ids"])
    assert run["text"] == {"text": generated["text"]}
    assert run["calls"]["calls"] == [{"tool_index": 0, "name": "bash", "parameters": '{"command": "ls"}'}]
    assert run["reasoning"]["reasoning_text"] == "I should look."


def test_pause_modes(run: dict[str, Any]) -> None:
    aborted = run["abort"]["choices"][0]
    assert aborted["finish_reason"] == "abort" and aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < aborted["meta_info"]["completion_tokens"] < 64
    for mode in ("in_place", "retract"):
        meta = run[mode]["meta_info"]
        assert meta["finish_reason"]["type"] == "stop", mode
        spans = meta["weight_versions"]
        assert [s["version"] for s in spans] == ["default" if mode == "in_place" else "after-in_place", f"after-{mode}"]
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == len(run[mode]["output_ids"])
        assert meta["weight_version"] == f"after-{mode}"
        assert meta["num_retractions"] == (1 if mode == "retract" else 0)


def test_weight_updates_versions_and_cache(run: dict[str, Any]) -> None:
    assert run["failed"]["success"] is False and "Cannot find any model weights" in run["failed"]["message"]
    assert run["loaded"] == {"success": True, "message": "Succeeded to update model weights. Weight version updated "
                             "to step-1.", "num_paused_requests": 0}
    assert run["after"]["meta_info"]["weight_version"] == "step-1"
    assert run["version"]["new_version"] == "step-2" and run["model_info"]["weight_version"] == "step-2"
    assert run["model_info"]["model_path"] == run["weights"]
    assert run["flush"].status_code == 200 and run["flush"].text.startswith("Cache flushed.")
    assert run["server_info"]["tool_call_parser"] == "qwen25" and run["server_info"]["reasoning_parser"] == "qwen3"


def test_vllm_only_routes_are_not_served(run: dict[str, Any]) -> None:
    assert set(run["vllm_routes"].values()) == {404}, run["vllm_routes"]


def test_requests_are_logged_as_received(run: dict[str, Any]) -> None:
    paths = [entry["path"] for entry in run["received"]]
    assert "/v1/chat/completions" in paths and "/generate" in paths and "/update_weights_from_disk" in paths
    chat = next(e for e in run["received"] if e["path"] == "/v1/chat/completions")
    assert chat["body"]["rid"] == "chat-1" and chat["body"]["seed"] == 11


def test_malformed_generate_gets_sglangs_errors(tmp_path: Path) -> None:
    with EngineServer(EngineConfig(family="sglang")) as engine:
        wrong_type = httpx.post(engine.url + "/generate", json={"input_ids": "not ids"}, timeout=30)
        unknown = httpx.post(engine.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_tokens": 3}},
                             timeout=30)
        neither = httpx.post(engine.url + "/generate", json={"sampling_params": {}}, timeout=30)
        extra = httpx.post(engine.url + "/v1/chat/completions", json={"messages": MESSAGES, "not_a_field": 1}, timeout=30)
        logged = engine.requests()
    assert wrong_type.status_code == 400 and wrong_type.json()["object"] == "error"
    assert unknown.status_code == 400 and unknown.json()["error"].startswith("unknown field `max_tokens`")
    assert neither.status_code == 400 and "message" in neither.json()["error"]
    assert extra.status_code == 200  # ignored, as SGLang's pydantic models do
    assert logged[-1]["body"]["not_a_field"] == 1
