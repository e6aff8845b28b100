"""Through real HTTP, the recorder in front of the real vLLM: what is recorded is what vLLM sent.

Every comparison is against vLLM's own bytes, captured on the wire (``capture_proxy.py``), or its
own ``/tokenize``; nothing asserts the model's words (a small model on a CPU is not bit-stable).
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from real_stack import MODEL, RealStack
from capture_proxy import CaptureProxy
from openenv_harness.engine import VLLMServer

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Say hello in five words."}]
#: exactly the keys a plain OpenAI server sends (values may be null)
OPENAI_TOP = {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier"}
OPENAI_CHOICE = {"index", "message", "logprobs", "finish_reason"}
OPENAI_USAGE = {"prompt_tokens", "completion_tokens", "total_tokens"}


def _tokenize(vllm: VLLMServer, messages: list, tools: list | None = None) -> list[int]:
    body: dict = {"model": MODEL, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    reply = httpx.post(vllm.url + "/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def _sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_records_hold_vllms_own_ids_and_logprobs(stream: bool, vllm: VLLMServer, stack: RealStack,
                                                 capture: CaptureProxy) -> None:
    sid, secret = stack.session()
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 12, "temperature": 0, "seed": 1,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    reply = stack.chat(sid, secret, body)
    assert reply.status_code == 200, reply.text
    [record] = stack.admin.records(sid)
    # the agent's call (the recorder's own engine probes -- its logprobs-mode measurement -- pass the proxy too)
    [exchange] = [e for e in capture.chat_exchanges() if e.request_json().get("messages") == MESSAGES]
    raw = exchange.reply_json()
    choice = raw["choices"][0]
    md = record["metadata"]
    assert md["status"] == "ok" and md["trainable"] is True, md["invalid_reasons"]
    # canonical prompt ids: vLLM's reply, and vLLM's own rendering of the request the agent sent
    assert record["prompt_token_ids"] == raw["prompt_token_ids"] == _tokenize(vllm, MESSAGES, TOOLS)
    assert record["completion_token_ids"] == choice["token_ids"]
    assert record["per_token_logps"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert len(record["completion_token_ids"]) == raw["usage"]["completion_tokens"]
    # what reached the engine: the agent's body plus the capture fields, never streamed upstream
    sent = exchange.request_json()
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["stream"] is False
    assert {k: sent[k] for k in ("messages", "tools", "temperature", "seed", "max_tokens")} == \
        {k: body[k] for k in ("messages", "tools", "temperature", "seed", "max_tokens")}
    # the agent sees what a plain OpenAI server sends: no engine-only field of vLLM's reply
    if stream:
        chunks = _sse_events(reply.text)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == choice["message"]["content"]
        assert chunks[-1]["choices"] == [] and set(chunks[-1]["usage"]) == OPENAI_USAGE
        for chunk in chunks:
            assert "prompt_token_ids" not in chunk and "prompt_text" not in chunk
            assert all("token_ids" not in c for c in chunk["choices"])
    else:
        agent = reply.json()
        assert set(agent) <= OPENAI_TOP and set(agent["choices"][0]) <= OPENAI_CHOICE
        assert set(agent["usage"]) == OPENAI_USAGE
        assert agent["choices"][0]["message"]["content"] == choice["message"]["content"]
        assert set(raw) - OPENAI_TOP >= {"prompt_token_ids", "prompt_text", "kv_transfer_params", "metrics"}
    # the stored response is the agent's view too (the extras are evidence, kept in the record's fields)
    assert set(record["response"]) <= OPENAI_TOP
    assert "token_ids" not in record["response"]["choices"][0]
    assert "stop_reason" not in record["response"]["choices"][0]


def test_effective_sampling_is_recorded_with_the_engines_defaults(vllm: VLLMServer, tmp_path,
                                                                  capture: CaptureProxy) -> None:
    """The agent sends no temperature: vLLM applies the model's generation config; the record says
    which values were in force and where each came from."""
    from openenv_harness.engine.launcher import sampling_defaults

    defaults = sampling_defaults(vllm.settings.model_dir)
    assert defaults == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    for configured in (True, False):
        s = RealStack(tmp_path / f"r{configured}.db", capture.url,
                      **({"engine_sampling_defaults": defaults, "engine_logprobs_mode": "raw_logprobs"} if configured else {}))
        try:
            sid, secret = s.session(sampling={"seed": 3})
            reply = s.chat(sid, secret, {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "top_p": 0.5})
            assert reply.status_code == 200, reply.text
            prov = s.admin.records(sid)[0]["metadata"]["provenance"]
        finally:
            s.close()
        assert prov["sampling_from_agent"] == {"model": MODEL, "max_tokens": 4, "top_p": 0.5}
        assert prov["sampling_pinned"] == {"seed": 3}
        # configured by whoever started the engine, or probed from vLLM's render route: the same values
        assert prov["engine_sampling_defaults_source"] == ("configured" if configured else "probed")
        assert {k: prov["engine_sampling_defaults"][k] for k in defaults} == defaults
        assert {k: prov["sampling_effective"][k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")} \
            == {"temperature": 0.7, "top_p": 0.5, "top_k": 20, "repetition_penalty": 1.05}
        assert not set(defaults) & set(prov["sampling_unknown"])  # every field the defaults cover is known
        # declared or not, the recorder measured the engine's mode, and a measurement is what is recorded
        assert (prov["logprobs_mode"], prov["logprobs_mode_source"]) == ("raw_logprobs", "measured")


def test_constrained_tool_calls_are_flagged_and_their_logprobs_not_the_policys(stack: RealStack,
                                                                               capture: CaptureProxy) -> None:
    sid, secret = stack.session()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "List the files in /tmp."}], "tools": TOOLS,
            "tool_choice": "required", "temperature": 0, "max_tokens": 48}
    reply = stack.chat(sid, secret, body)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["tool_calls"] and message["tool_calls"][0]["function"]["name"] == "bash"
    [record] = stack.admin.records(sid)
    md = record["metadata"]
    assert md["provenance"]["decoding_constraint"] == {"tool_choice": "required"}
    assert md["logprobs_are_policy"] is False
    assert md["trainable"] is True  # the ids are still what was sampled; the flag says what to do with the logprobs
    # under the grammar the tag is sampled as text pieces, not the special <tool_call> id (151657)
    # the template renders on replay: the source of this stack's replay drift at every tool turn
    assert record["completion_token_ids"][:4] == [27, 14172, 13429, 397]
    assert 151657 not in record["completion_token_ids"]


def test_engine_errors_are_relayed_and_recorded_failed(stack: RealStack) -> None:
    sid, secret = stack.session()
    too_long = stack.chat(sid, secret, {"model": MODEL, "messages": MESSAGES, "max_tokens": 20000})
    assert too_long.status_code == 400
    assert "max_model_len" in too_long.json()["error"]["message"]
    [record] = stack.admin.records(sid)
    md = record["metadata"]
    assert md["status"] == "failed" and md["trainable"] is False
    assert md["error"]["upstream_status"] == 400 and md["error"]["upstream_body"]["error"]["param"] == "max_tokens"
    assert record["prompt_token_ids"] == [] and record["completion_token_ids"] == []


def test_unknown_model_is_relayed_as_vllms_404(vllm: VLLMServer, tmp_path) -> None:
    """Without a served-model pin, the agent's model name goes to vLLM, which refuses it."""
    s = RealStack(tmp_path / "records.db", vllm.url)
    try:
        sid, secret = s.session()
        reply = s.chat(sid, secret, {"model": "no-such-model", "messages": MESSAGES, "max_tokens": 4})
        assert reply.status_code == 404, reply.text
        [record] = s.admin.records(sid)
        assert record["metadata"]["status"] == "failed"
        assert record["metadata"]["error"]["upstream_body"]["error"]["type"] == "NotFoundError"
    finally:
        s.close()


def test_the_recorder_reads_the_engines_context_length(stack: RealStack) -> None:
    engine = stack.admin.health()["engine"]
    assert engine["max_model_len"] == 16384 and engine["served_models"] == [MODEL]
    assert engine["version"] == "0.32.0"
