"""The SGLang adapter on its own: each recorder route mapped onto SGLang's, each SGLang reply read back into
the recorder's shape, against a scripted inner transport that answers in SGLang 0.5.23's reply shapes
(the shapes the reference engine's SGLang flavour serves, held to SGLang's classes in its conformance test)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.recorder.upstream.routes import DERENDER, GENERATE, RENDER, TOKENIZE
from openenv_harness.recorder.upstream.sglang import SGLangEngine, chat_reply, engine_for, render_body, sglang_chat_body


def _sglang_chat(prompt: list[int], out: list[tuple[float, int]], *, response_ids: list[int] | None = None,
                 spans: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": "r1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": len(prompt),
                            "completion_tokens": len(out), "weight_version": "default",
                            "output_token_logprobs": [[lp, tid, "x"] for lp, tid in out]}
    if spans is not None:
        meta["weight_versions"] = spans
    return {"id": "r1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "reasoning_content": None,
                                                 "tool_calls": None},
                         "logprobs": {"content": [{"token": "x", "bytes": [120], "logprob": lp, "top_logprobs": []}
                                                  for lp, _ in out]},
                         "finish_reason": "stop", "matched_stop": 2, "prompt_token_ids": prompt,
                         "response_token_ids": [t for _, t in out] if response_ids is None else response_ids,
                         "meta_info": meta}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)},
            "metadata": {"weight_version": "default"}}


class Scripted(Upstream):
    """Answers each SGLang route from a table and keeps what it was asked."""

    def __init__(self, answers: dict[str, UpstreamReply]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Any, Any]] = []
        self.name = "http://sglang.test"

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        raise AssertionError("the adapter posts SGLang's chat route itself")

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        return await self.request("POST", path, json=body)

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: dict[str, str] | None = None) -> UpstreamReply:
        self.asked.append((path, json, params))
        return self.answers.get(path, UpstreamReply(status=404, json=None, body=b"not found"))


def _ok(body: dict[str, Any]) -> UpstreamReply:
    return UpstreamReply(status=200, json=body)


def test_a_chat_body_asks_sglang_for_its_evidence_fields_and_drops_vllms() -> None:
    body = sglang_chat_body({"messages": [], "return_token_ids": True, "return_weight_versions": True,
                             "logprobs": True, "top_logprobs": 0, "stream": False, "temperature": 0.5})
    assert body == {"messages": [], "return_prompt_token_ids": True, "return_token_ids": True,
                    "return_meta_info": True, "logprobs": True, "top_logprobs": 0, "stream": False,
                    "temperature": 0.5}


def test_a_chat_reply_is_read_into_the_recorders_shape_with_the_weight_spans() -> None:
    spans = [{"version": "0", "start": 0, "end": 1}, {"version": "1", "start": 1, "end": 2}]
    reply = chat_reply(_ok(_sglang_chat([1, 2, 3], [(-0.5, 7), (-0.25, 2)], spans=spans)))
    assert reply.status == 200 and reply.doubts == []
    out = reply.json
    assert out is not None and out["prompt_token_ids"] == [1, 2, 3]
    choice = out["choices"][0]
    assert choice["token_ids"] == [7, 2] and choice["weight_versions"] == spans
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["token_id:7", "token_id:2"]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.25]
    assert not {"prompt_token_ids", "response_token_ids", "meta_info"} & set(choice)
    assert "metadata" not in out


def test_a_reply_whose_two_id_lists_disagree_is_doubted() -> None:
    reply = chat_reply(_ok(_sglang_chat([1], [(-0.5, 7)], response_ids=[8])))
    assert reply.doubts and "sglang_ids_disagree" in reply.doubts[0]
    assert reply.json is not None and reply.json["choices"][0]["token_ids"] == [8]


def test_an_error_reply_is_relayed_as_it_is() -> None:
    error = UpstreamReply(status=400, json={"object": "error", "message": "bad"}, body=b'{"message":"bad"}')
    assert chat_reply(error) is error


def test_render_asks_tokenize_with_an_explicit_generation_prompt_and_answers_a_parse_context() -> None:
    inner = Scripted({"/v1/tokenize": _ok({"tokens": [5, 6], "count": 2, "max_model_len": 4096})})
    engine = SGLangEngine(inner)
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [], "temperature": 0.2,
               "logprobs": True, "stream": False}
    reply = asyncio.run(engine.post_for_session(RENDER, request, session_id="s"))
    assert inner.asked[0][1] == {"model": "m", "messages": request["messages"], "tools": [],
                                 "add_generation_prompt": True}
    assert reply.json == {"token_ids": [5, 6], "sampling_params": {},
                          "parse_context": {k: v for k, v in request.items() if k != "stream"}}
    assert render_body({"messages": [], "add_generation_prompt": False})["add_generation_prompt"] is False


def test_a_one_step_sample_is_sglangs_chat_route_with_input_ids() -> None:
    inner = Scripted({"/v1/chat/completions": _ok(_sglang_chat([5, 6, 9], [(-0.1, 4)]))})
    engine = SGLangEngine(inner)
    context = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
    reply = asyncio.run(engine.post_for_session(GENERATE, {"token_ids": [5, 6, 9], "sampling_params": {},
                                                           "output_mode": "derender", "parse_context": context},
                                                session_id="s"))
    sent = inner.asked[0][1]
    assert sent["input_ids"] == [5, 6, 9] and sent["messages"] == context["messages"]
    assert sent["return_meta_info"] is True
    assert reply.json is not None and reply.json["output_mode"] == "derender"
    assert reply.json["choices"][0]["token_ids"] == [4] and reply.json["choices"][0]["message"]["content"] == "hi"
    assert engine.served_by(GENERATE) == "/v1/chat/completions (input_ids)"


@pytest.mark.parametrize("route", [GENERATE, DERENDER])
def test_routes_sglang_cannot_serve_answer_404_so_the_call_falls_back(route: str) -> None:
    engine = SGLangEngine(Scripted({}))
    reply = asyncio.run(engine.post_for_session(route, {"token_ids": [1]}, session_id="s"))
    assert reply.status == 404 and b"SGLang" in reply.body


@pytest.mark.parametrize(("mode", "sglang_mode"), [("keep", "retract"), ("abort", "abort"), ("wait", "retract")])
def test_the_fence_pauses_with_sglangs_modes(mode: str, sglang_mode: str) -> None:
    inner = Scripted({"/pause_generation": _ok({"status": "ok"}), "/continue_generation": _ok({"status": "ok"})})
    engine = SGLangEngine(inner)
    assert asyncio.run(engine.request("POST", "/pause", params={"mode": mode})).status == 200
    assert asyncio.run(engine.request("POST", "/resume")).status == 200
    assert [(p, b) for p, b, _ in inner.asked] == [("/pause_generation", {"mode": sglang_mode}),
                                                   ("/continue_generation", {})]
    assert asyncio.run(engine.request("POST", "/pause", params={"mode": "drain"})).status == 400


def test_a_wait_pause_waits_for_the_calls_in_flight() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        release = asyncio.Event()

        class Slow(Scripted):
            async def request(self, method: str, path: str, *, json: Any = None,
                              params: dict[str, str] | None = None) -> UpstreamReply:
                if path == "/v1/chat/completions":
                    await release.wait()
                    order.append("call ended")
                    return _ok(_sglang_chat([1], [(-0.1, 2)]))
                order.append("paused")
                return _ok({"status": "ok"})

        engine = SGLangEngine(Slow({}))
        call = asyncio.ensure_future(engine.chat({"messages": []}, session_id="s"))
        await asyncio.sleep(0)
        pause = asyncio.ensure_future(engine.request("POST", "/pause", params={"mode": "wait"}))
        await asyncio.sleep(0.05)
        assert not pause.done()
        release.set()
        await asyncio.gather(call, pause)
        return order

    assert asyncio.run(scenario()) == ["call ended", "paused"]


def test_tokenize_detokenize_and_version_are_read_in_vllms_words() -> None:
    inner = Scripted({"/v1/tokenize": _ok({"tokens": [1], "count": 1, "max_model_len": 9}),
                      "/v1/detokenize": _ok({"text": "a"}), "/server_info": _ok({"version": "0.5.23"})})
    engine = SGLangEngine(inner)
    tokenized = asyncio.run(engine.request("POST", TOKENIZE, json={"messages": [], "return_token_strs": True}))
    assert tokenized.json == {"tokens": [1], "count": 1, "max_model_len": 9}
    assert inner.asked[0][1] == {"messages": [], "add_generation_prompt": True}
    assert asyncio.run(engine.request("POST", "/detokenize", json={"tokens": [1]})).json == {"prompt": "a"}
    assert inner.asked[1][1] == {"tokens": [1], "skip_special_tokens": False}
    assert asyncio.run(engine.request("GET", "/version")).json == {"version": "sglang-0.5.23"}


@pytest.mark.parametrize(("answer", "family"), [(_ok({"version": "0.5.23"}), "sglang"),
                                                (UpstreamReply(status=404, json={"detail": "Not Found"}), "vllm")])
def test_auto_reads_the_family_from_the_engine_at_start(answer: UpstreamReply, family: str) -> None:
    inner = Scripted({"/server_info": answer})
    engine = engine_for("auto", inner)
    assert engine.family == "vllm"  # until started: vLLM's routes
    asyncio.run(engine.start())
    assert engine.family == family
    assert engine_for("sglang", inner).family == "sglang" and engine_for("vllm", inner) is inner


def test_a_recorder_on_auto_records_an_sglang_engines_evidence(tmp_path: Any) -> None:
    import httpx

    from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
    from openenv_harness.testing.engine import EngineConfig, EngineServer

    with EngineServer(EngineConfig(family="sglang")) as engine, RecorderServer(RecorderConfig(
            store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token="a" * 32,
            engine_family="auto")) as recorder, RecorderClient(recorder.url, "a" * 32) as admin:
        session = admin.create_session()
        reply = httpx.post(f"{session['base_url']}/chat/completions", timeout=60,
                           headers={"authorization": f"Bearer {session['secret']}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        record = admin.records(session["session_id"])[0]
        sent = [e["body"] for e in engine.requests() if e["path"] == "/v1/chat/completions"]
    assert record["metadata"]["status"] == "ok" and record["prompt_token_ids"] and record["completion_token_ids"]
    assert sent and all(b["return_meta_info"] is True and "return_weight_versions" not in b for b in sent)


def test_top_logprobs_are_carried_as_token_id_alternatives() -> None:
    raw = _sglang_chat([1], [(-0.5, 7)])
    raw["choices"][0]["meta_info"]["output_top_logprobs"] = [[[-0.5, 7, "x"], [-1.5, 9, "y"]]]
    content = chat_reply(_ok(raw)).json["choices"][0]["logprobs"]["content"]  # type: ignore[index]
    assert content[0]["top_logprobs"] == [{"token": "token_id:7", "logprob": -0.5, "bytes": None},
                                          {"token": "token_id:9", "logprob": -1.5, "bytes": None}]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_the_logprobs_mode_is_measured_on_sglang(mode: str) -> None:
    """The recorder's two-temperature probe reads SGLang's top alternatives through the adapter."""
    from openenv_harness.recorder.engine_knowledge.provenance import measure_logprobs_mode
    from openenv_harness.recorder.upstream.h1_engine import H1Engine
    from openenv_harness.testing.engine import EngineConfig, EngineServer

    async def measure(url: str) -> tuple[str, str]:
        engine = SGLangEngine(H1Engine(url))
        await engine.start()
        try:
            return await measure_logprobs_mode(engine)
        finally:
            await engine.aclose()

    with EngineServer(EngineConfig(family="sglang", logprobs_mode=mode)) as server:
        measured, how = asyncio.run(measure(server.url))
    assert measured == mode, how
