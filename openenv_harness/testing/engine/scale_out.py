"""vLLM's scale-out routes on the reference engine: render, generate, derender, and id prompts.

Why: the incremental prompt mode asks the engine to render messages without sampling
(``POST /v1/chat/completions/render``), to sample from exact ids (``POST /inference/v1/generate``,
or ``POST /v1/completions`` with a ``list[int]`` prompt) and to parse sampled ids back into a chat
reply with its own parsers (``POST /v1/chat/completions/derender``). vLLM 0.32 serves these with
``--enable-scale-out`` (``EngineConfig.scale_out`` here); their shapes follow the real server's
(checked by ``tests/real_engine/test_real_scale_out.py``). ``EngineConfig.generate_derender`` answers
as vLLM 0.33 (render's ``parse_context``, generate's ``output_mode="derender"``), which cannot run here:
those replies' keys are checked against field names read off its source
(``tests/testing/engine/vllm033_fields.json``).

Sampling from ids has no messages to pick a scripted turn from, so this test double reads the
roles back out of the prompt (``<|im_start|>role`` headers, ``prompt_reading.py``: turn by turn, each
turn decoded once): the same turn index and the same aux rule (no tool list rendered) as
``policy.choose_turn`` applies to a chat request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv_harness.testing.engine.chat import (
    ChatRequest,
    effective_sampling,
    empty_tools,
    error_response,
    validation_message,
)
from openenv_harness.testing.engine.config import SESSION_HEADER, EngineConfig
from openenv_harness.testing.engine.messages import MessageError
from openenv_harness.testing.engine.parser import parse_output
from openenv_harness.testing.engine.policy import Sample, as_reported, choose_turn, logprob_scale, sample_turn
from openenv_harness.testing.engine.prompt import render_prompt
from openenv_harness.testing.engine.state import EngineState
from openenv_harness.testing.engine.wire import dumps, new_id, output_text



class ParseContext(BaseModel):
    """vLLM 0.33's ``ParseContext``: the chat settings render hands generate, which parses a sample with them
    at ``output_mode="derender"``. Unknown fields are kept, so generate can refuse them where it reads them
    (a newer render's), as vLLM does."""

    model_config = ConfigDict(extra="allow")

    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    history_tool_call_cnt: int = Field(0, ge=0)


class GenerateRequest(BaseModel):
    """``/inference/v1/generate``'s body (the fields this engine reads; others are accepted)."""

    model_config = ConfigDict(extra="allow")

    token_ids: list[int] = Field(min_length=1)
    sampling_params: dict[str, Any]
    model: str | None = None
    stream: bool = False
    return_token_ids: bool | None = None
    output_mode: str = "tokens"
    #: vLLM 0.33: the chat settings generate parses with at ``output_mode="derender"`` (from render)
    parse_context: ParseContext | None = None


class DerenderRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    generate_response: dict[str, Any]
    #: vLLM reads only the last few (to seed detokenizing); callers may send just a tail
    prompt_token_ids: list[int] = Field(default_factory=list)
    #: for usage, as vLLM: the caller knows the prompt's length from the render step
    prompt_tokens: int | None = None
    chat_request: dict[str, Any]


class IdCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt: list[int] | str
    model: str | None = None
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    stream: bool = False


def _json(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


async def _body(request: Request, model: type[BaseModel]) -> tuple[BaseModel | None, Any, Response | None]:
    try:
        raw = orjson.loads(await request.body() or b"{}")
        return model.model_validate(raw), raw, None
    except orjson.JSONDecodeError as exc:
        return None, None, error_response(400, f"Invalid JSON body: {exc}")
    except ValidationError as exc:
        return None, None, error_response(400, validation_message(exc))


def _sampling_params(config: EngineConfig, chat: ChatRequest, prompt_len: int) -> dict[str, Any]:
    """What the engine would sample the chat request with: its fields over the generation config
    (vLLM's render reports these effective values)."""
    extra = chat.model_extra or {}
    params: dict[str, Any] = effective_sampling(config, extra)
    params.update(stop=extra.get("stop") or [], stop_token_ids=extra.get("stop_token_ids") or [])
    default = config.generation_config.max_new_tokens if config.generation_config else None
    params["max_tokens"] = (chat.max_completion_tokens or chat.max_tokens or default
                            or max(1, config.max_model_len - prompt_len))
    if chat.logprobs:
        params["logprobs"] = chat.top_logprobs or 0
    params.update(skip_special_tokens=False, output_kind=2, skip_clone=True, bad_words=[],
                  skip_reading_prefix_cache=False)
    return params


async def _paced(state: EngineState, count: int) -> tuple[int, bool]:
    """Emit ``count`` tokens through the fence (a pause can land mid-generation); (emitted, aborted)."""
    fence, config = state.fence, state.config
    generation = await fence.admit()
    emitted = 0
    try:
        if config.prefill_delay_s:
            await generation.wait_aborted(config.prefill_delay_s)
        for _ in range(count):
            if not await fence.step(generation, config.decode_delay_s):
                return emitted, True
            emitted += 1
    finally:
        fence.release(generation)
    return emitted, False


async def _sample_ids(state: EngineState, request: Request, path: str, body: Any, prompt_ids: list[int],
                      max_tokens: int | None) -> tuple[Sample, list[int], list[float], str] | Response:
    """Sample the scripted turn a prompt of ids gets; faults registered for that turn apply."""
    vocab = state.tokenizer.vocab_size
    if prompt_ids and (min(prompt_ids) < 0 or max(prompt_ids) >= vocab):  # C-speed bounds; the list only then
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        return error_response(400, f"Token ids out of vocabulary: {bad[:5]}", "token_ids")
    if len(prompt_ids) >= state.config.max_model_len:
        return error_response(400, f"This model's maximum context length is {state.config.max_model_len} tokens. "
                              f"However, your request has {len(prompt_ids)} input tokens.", "input_tokens")
    session = request.headers.get(SESSION_HEADER)
    model = body.get("model") if isinstance(body, dict) else None
    entry = state.record(session=session, model=model, path=path, headers=dict(request.headers), body=body)
    keys = state.keys_for(session, model)
    script_key, script = state.script_for(keys)
    choice = choose_turn(state.prompt_reader.turn_body(prompt_ids), script)
    entry.update(turn_index=choice.index, turn_kind=choice.kind)
    fault = state.faults.take(keys, choice.index, choice.kind == "aux")
    if fault is not None and fault.latency_s:
        await asyncio.sleep(fault.latency_s)
    if fault is not None and fault.status is not None:
        return Response(dumps(fault.error_response_body(dict(request.headers))), status_code=fault.status,
                        media_type="application/json", headers=fault.error_headers())
    room = state.config.max_model_len - len(prompt_ids)
    params = body.get("sampling_params") if path == "/inference/v1/generate" and isinstance(body, dict) else body
    temperature = float(effective_sampling(state.config, params if isinstance(params, dict) else {})["temperature"])
    sample = as_reported(sample_turn(choice, script, script_key, state.tokenizer, state.template,
                                     min(max_tokens, room) if max_tokens else room),
                         logprob_scale(state.config.logprobs_mode, temperature))
    emitted, aborted = await _paced(state, len(sample.token_ids))
    ids, logprobs = list(sample.token_ids[:emitted]), list(sample.logprobs[:emitted])
    entry.update(sampled={"prompt_token_ids": list(prompt_ids), "token_ids": ids, "logprobs": logprobs})
    return sample, ids, logprobs, "abort" if aborted else sample.finish_reason


async def render(state: EngineState, request: Request) -> Response:
    parsed, raw, error = await _body(request, ChatRequest)
    if error is not None:
        return error
    assert isinstance(parsed, ChatRequest)
    state.record(session=request.headers.get(SESSION_HEADER), model=parsed.model, path=request.url.path,
                 headers=dict(request.headers), body=raw)
    refused = empty_tools(state.config, parsed)
    if refused is not None:
        return refused
    try:  # the render route validates a chat request, so it preprocesses like the chat route
        ids = render_prompt(state.config, state.template, state.tokenizer, messages=parsed.messages,
                            tools=parsed.tools, add_generation_prompt=parsed.add_generation_prompt,
                            chat_template_kwargs=parsed.chat_template_kwargs, route="chat").ids
    except MessageError as exc:
        return error_response(400, str(exc), exc.param)
    fault = _render_fault(state, request, parsed)
    if fault is not None:
        return fault
    return _json({
        "request_id": new_id(), "token_ids": ids, "token_offsets": None, "features": None, "content_parts": None,
        "sampling_params": _sampling_params(state.config, parsed, len(ids)),
        "model": parsed.model, "reasoning_ended": None, "reasoning_parser_kwargs": None,
        "return_token_ids": parsed.return_token_ids, "output_mode": "tokens", "stream": bool(parsed.stream),
        "stream_options": None, "cache_salt": None, "priority": 0, "kv_transfer_params": None,
        "ec_transfer_params": None,
        **({"parse_context": _parse_context(parsed)} if state.config.generate_derender else {}),
    })


def _parse_context(chat: ChatRequest) -> dict[str, Any]:
    """vLLM 0.33's ``ParseContext``: what generate needs to parse a sample as this chat request's reply
    (the history only as its count of tool calls, which numbers new calls in some id schemes)."""
    extra = chat.model_extra or {}
    calls = sum(len(m.get("tool_calls") or []) for m in chat.messages
                if isinstance(m, dict) and m.get("role") == "assistant")
    return {"tools": chat.tools, "tool_choice": chat.tool_choice if chat.tool_choice is not None else
            ("auto" if chat.tools else "none"),
            "parallel_tool_calls": extra.get("parallel_tool_calls", True),
            "include_reasoning": extra.get("include_reasoning", True),
            "chat_template_kwargs": chat.chat_template_kwargs or {}, "history_tool_call_cnt": calls}


def _render_fault(state: EngineState, request: Request, chat: ChatRequest) -> Response | None:
    """A fault registered for the render route (``Fault.route``), matched by the turn these messages ask for."""
    if not state.faults.targets("/v1/chat/completions/render"):
        return None
    keys = state.keys_for(request.headers.get(SESSION_HEADER), chat.model)
    _, script = state.script_for(keys)
    choice = choose_turn({"messages": chat.messages, "tools": chat.tools}, script)
    fault = state.faults.take(keys, choice.index, choice.kind == "aux", route="/v1/chat/completions/render")
    if fault is None or fault.status is None:
        return None
    return Response(dumps(fault.error_response_body(dict(request.headers))), status_code=fault.status,
                    media_type="application/json")


async def generate(state: EngineState, request: Request) -> Response:
    parsed, raw, error = await _body(request, GenerateRequest)
    if error is not None:
        return error
    assert isinstance(parsed, GenerateRequest)
    params = parsed.sampling_params
    refusal = _one_step_refusal(state, parsed)
    if refusal is not None:
        return refusal
    one_step = parsed.output_mode == "derender"
    result = await _sample_ids(state, request, "/inference/v1/generate", raw, parsed.token_ids,
                               params.get("max_tokens"))
    if isinstance(result, Response):
        return result
    _, ids, logprobs, finish = result
    content = None
    if params.get("logprobs") is not None:  # vLLM lists the sampled token among the top ones even at 0
        content = [{"token_id": t, "logprob": lp, "rank": 1,
                    "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}]}
                   for t, lp in zip(ids, logprobs)]
    n = len(ids)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": ids,
                              "routed_experts": None, "sampling_mask": None,
                              "weight_versions": [{"version": state.weight_version, "start": 0, "end": n}],
                              "logprobs": {"content": content} if content is not None else None}
    if one_step:  # vLLM 0.33: derender's parse of the sample, in generate's reply
        assert parsed.parse_context is not None
        context = dict(parsed.parse_context)  # its fields as they are: a dump would copy the tool list
        message, choice["finish_reason"] = _derendered_message(state, ids, context, finish, parsed.token_ids)
        choice["message"] = message
        top = params.get("logprobs")  # chat logprobs, cut as the chat route cuts them (-1: every candidate)
        choice["logprobs"] = _chat_logprobs(state, content, None if top == -1 else top) \
            if content is not None else None
        if not context["include_reasoning"]:  # as vLLM: per-token metadata would show the reasoning
            choice["logprobs"] = choice["token_ids"] = choice["sampling_mask"] = None
    return _json({
        "request_id": new_id("generate-tokens-"), "model": parsed.model or state.config.served_model_name,
        "created": int(time.time()),
        "usage": {"prompt_tokens": len(parsed.token_ids), "total_tokens": len(parsed.token_ids) + n,
                  "completion_tokens": n, "prompt_tokens_details": None, "completion_tokens_details": None},
        "prompt_logprobs": None, "prompt_token_id_logprobs": None,
        "prompt_token_ids": parsed.token_ids if parsed.return_token_ids else None,
        "mm_placeholders": None, "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
        "output_mode": parsed.output_mode, "choices": [choice],
    })


def _one_step_refusal(state: EngineState, parsed: GenerateRequest) -> Response | None:
    """The 400s generate answers before sampling, in vLLM's order: the body's own checks (the output mode,
    detokenizing, a newer render's parse_context fields), then the handler's (streaming, a missing
    parse_context, a named tool_choice that names no tool)."""
    modes = ("tokens", "text", "derender") if state.config.generate_derender else ("tokens", "text")
    mode = parsed.output_mode
    if mode not in modes:
        return error_response(400, "output_mode: Input should be " + " or ".join(f"'{m}'" for m in modes),
                              "output_mode")
    if mode != "tokens" and parsed.sampling_params.get("detokenize") is False:
        return error_response(400, f"output_mode={mode!r} requires sampling_params.detokenize to be true")
    context = parsed.parse_context
    unknown = sorted(context.model_extra or ()) if context is not None else []
    if mode == "derender" and unknown:  # at other modes vLLM ignores them (it does not read parse_context)
        return error_response(400, f"Unknown parse_context fields {unknown}; the render server is newer than "
                              "this generate server")
    if parsed.stream:
        return error_response(400, "output_mode='derender' does not support stream=true." if mode == "derender"
                              else "the reference engine answers /inference/v1/generate non-streamed only", "stream")
    if mode != "derender":
        return None
    if context is None:  # this engine always has a tool parser, as vLLM's here
        return error_response(400, "output_mode='derender' requires parse_context on a server with a tool or "
                              "reasoning parser. Use the one returned by /render.")
    if isinstance(context.tool_choice, dict):
        name = (context.tool_choice.get("function") or {}).get("name")
        if not any((tool.get("function") or {}).get("name") == name for tool in context.tools or ()):
            return error_response(400, "The tool specified in `tool_choice` does not match any of the specified "
                                  "`tools`", "tool_choice")
    return None


def _chat_logprobs(state: EngineState, content: list[dict[str, Any]], top: int | None = None) -> dict[str, Any]:
    """Generate's id logprobs as a chat reply's: each token's text and bytes; ``top`` keeps that many of
    each position's candidates (None: all of them, as generate listed them)."""
    texts = state.tokenizer.token_texts
    return {"content": [
        {"token": texts[e["token_id"]], "logprob": e["logprob"], "bytes": list(texts[e["token_id"]].encode()),
         "top_logprobs": [{"token": texts[t["token_id"]], "logprob": t["logprob"],
                           "bytes": list(texts[t["token_id"]].encode())}
                          for t in (e.get("top_logprobs") or [])[:top]]}
        for e in content]}


def _derendered_message(state: EngineState, ids: list[int], chat: dict[str, Any], finish: str,
                        prompt_ids: list[int]) -> tuple[dict, str]:
    config = state.config
    tools_on = bool(chat.get("tools")) and chat.get("tool_choice") != "none"
    parsed = parse_output(output_text(state.tokenizer, ids), tools_on, tool_parser=config.tool_call_parser,
                          reasoning=config.reasoning_parser is not None,
                          open_think=state.prompt_reader.think_open(prompt_ids))
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None,
                               "annotations": None, "audio": None, "function_call": None}
    if parsed.tool_calls:
        message["tool_calls"] = [{"id": new_id("chatcmpl-tool-"), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls]
        # vLLM 0.33's derender reports the chat route's finish reason (a named tool choice stays "stop");
        # 0.32's passes generate's on as it is
        if finish == "stop" and config.generate_derender and not isinstance(chat.get("tool_choice"), dict):
            finish = "tool_calls"
    # vLLM drops the parsed reasoning when the request asks for none (include_reasoning=false)
    message[state.config.reasoning_field] = parsed.reasoning if chat.get("include_reasoning", True) is not False \
        else None
    return message, finish


async def derender(state: EngineState, request: Request) -> Response:
    parsed, raw, error = await _body(request, DerenderRequest)
    if error is not None:
        return error
    assert isinstance(parsed, DerenderRequest)
    state.record(session=request.headers.get(SESSION_HEADER), model=parsed.chat_request.get("model"),
                 path="/v1/chat/completions/derender", headers=dict(request.headers), body=raw)
    choices = parsed.generate_response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return error_response(400, "generate_response.choices: at least one choice is required")
    for each in choices:  # vLLM's derenderer refuses a sample of no ids (a ValueError, answered 400)
        if not isinstance(each, dict) or not each.get("token_ids"):
            index = each.get("index", 0) if isinstance(each, dict) else 0
            return error_response(400, f"choice {index} has empty or null token_ids")
    choice = choices[0]
    ids = [int(t) for t in choice["token_ids"]]
    message, finish = _derendered_message(state, ids, parsed.chat_request, choice.get("finish_reason") or "stop",
                                          parsed.prompt_token_ids)
    lp = choice.get("logprobs")
    # vLLM 0.32 hands generate's candidates on as they are; 0.33 cuts them to the chat request's top_logprobs,
    # as its chat route does (its generate does not cut them itself)
    top = (parsed.chat_request.get("top_logprobs") or 0) if state.config.generate_derender else None
    logprobs = _chat_logprobs(state, lp["content"], top) \
        if isinstance(lp, dict) and isinstance(lp.get("content"), list) else None
    n = len(ids)
    # the sampled ids come back where asked for, unless the parsers hid reasoning (vLLM: they would show it)
    chat = parsed.chat_request
    echoed = ids if chat.get("return_token_ids") and chat.get("include_reasoning", True) is not False else None
    return _json({
        "id": parsed.generate_response.get("request_id") or new_id(), "object": "chat.completion",
        "created": int(time.time()), "model": parsed.generate_response.get("model") or state.config.served_model_name,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
                     "stop_reason": None, "token_ids": echoed, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": parsed.prompt_tokens or 0, "total_tokens": (parsed.prompt_tokens or 0) + n,
                  "completion_tokens": n, "prompt_tokens_details": None, "completion_tokens_details": None},
        "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None,
    })


async def id_completion(state: EngineState, request: Request) -> Response:
    """``/v1/completions`` with a ``list[int]`` prompt (a text prompt is encoded first)."""
    parsed, raw, error = await _body(request, IdCompletionRequest)
    if error is not None:
        return error
    assert isinstance(parsed, IdCompletionRequest)
    if parsed.stream:
        return error_response(400, "the reference engine answers /v1/completions non-streamed only", "stream")
    prompt = parsed.prompt if isinstance(parsed.prompt, list) else state.tokenizer.encode(parsed.prompt)
    if not prompt:
        return error_response(400, "prompt: at least one token is required", "prompt")
    result = await _sample_ids(state, request, "/v1/completions", raw, prompt, parsed.max_tokens)
    if isinstance(result, Response):
        return result
    _, ids, logprobs, finish = result
    texts = state.tokenizer.token_texts
    lp = None
    if parsed.logprobs is not None:
        # vLLM: the server flag or the request's field spells tokens as "token_id:N" (offsets still
        # count the decoded text)
        as_ids = bool(state.config.return_tokens_as_token_ids or parsed.return_tokens_as_token_ids)
        names = [f"token_id:{t}" if as_ids else texts[t] for t in ids]
        offsets, at = [], 0
        for t in ids:
            offsets.append(at)
            at += len(texts[t])
        lp = {"text_offset": offsets, "token_logprobs": logprobs, "tokens": names,
              "top_logprobs": [{name: v} for name, v in zip(names, logprobs)]}
    want_ids = bool(parsed.return_token_ids)
    n = len(ids)
    return _json({
        "id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
        "model": parsed.model or state.config.served_model_name,
        "choices": [{"index": 0, "text": output_text(state.tokenizer, ids), "logprobs": lp, "finish_reason": finish,
                     "stop_reason": None, "token_ids": ids if want_ids else None, "prompt_logprobs": None,
                     "prompt_token_ids": prompt if want_ids else None, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n,
                  "prompt_tokens_details": None, "completion_tokens_details": None},
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    })


def add_scale_out_routes(app: FastAPI, state: EngineState) -> None:
    """Register the routes (what ``--enable-scale-out`` adds, plus id prompts on /v1/completions);
    ``generate_route=False`` leaves out /inference/v1/generate. Each is also a lean route of the
    app (``app.EngineApp``) where it has them: answered without FastAPI's request machinery."""
    def bind(handler: Any) -> Any:
        async def route(request: Request) -> Response:
            return await handler(state, request)
        return route

    lean: dict[str, Any] | None = getattr(app, "lean_routes", None)
    routes = {"/v1/chat/completions/render": render, "/v1/chat/completions/derender": derender,
              "/v1/completions": id_completion}
    if state.config.generate_route:
        routes["/inference/v1/generate"] = generate
    for path, handler in routes.items():
        route = bind(handler)
        app.add_api_route(path, route, methods=["POST"])
        if lean is not None:
            lean[path] = route
