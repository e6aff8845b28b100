"""``POST /v1/chat/completions``: render, "sample", pace through the fence, reply like vLLM.

The flow of one call: parse and validate the body -> log it -> pick the script and the turn ->
apply an injected fault if one matches -> preprocess, render and encode the prompt like vLLM ->
check lengths and fill in sampling defaults like vLLM -> sample the scripted turn -> emit it token
by token through the fence (so a pause can land mid-generation) -> answer as JSON or as vLLM's
SSE stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv_harness.testing.engine.config import SESSION_HEADER, EngineConfig
from openenv_harness.testing.engine.faults import Fault, error_body
from openenv_harness.testing.engine.messages import MessageError
from openenv_harness.testing.engine.policy import as_reported, choose_turn, logprob_scale, sample_turn
from openenv_harness.testing.engine.prompt import render_prompt
from openenv_harness.testing.engine.state import EngineState
from openenv_harness.testing.engine.wire import ReplySpec, StreamEncoder, completion_body, dumps, new_id

#: Where the ASGI server's transport is stashed (see ``app.EngineApp``), so a fault can cut it.
TRANSPORT_SCOPE_KEY = "openenv_harness.transport"
#: vLLM's neutral sampling defaults (``--generation-config vllm``)
NEUTRAL_SAMPLING: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                            "repetition_penalty": 1.0, "presence_penalty": 0.0,
                                            "frequency_penalty": 0.0}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = True


class ChatRequest(BaseModel):
    """The fields the reference engine reads; like vLLM, unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]]
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = 1
    logprobs: bool | None = False
    top_logprobs: int | None = Field(0, ge=0, le=20)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    return_weight_versions: bool | None = None


#: vLLM 0.32/0.33's answer to ``tools: []`` (its chat request validator, which the render route shares)
EMPTY_TOOLS_MESSAGE = ("`tools` must not be an empty array. Either provide at least one tool or omit the field "
                       "entirely. (parameter=tools)")


def empty_tools(config: EngineConfig, chat: ChatRequest) -> Response | None:
    """An empty tools array: a 400 where the release refuses it, else no tools at all (vLLM 0.34)."""
    if chat.tools is None or chat.tools:
        return None
    if config.empty_tools_rejected:
        return error_response(400, EMPTY_TOOLS_MESSAGE, "tools")
    chat.tools = None
    return None


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(error_body(status, message, param)), status_code=status,
                    media_type="application/json", headers=headers)


def validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())


async def drop_connection(request: Request) -> None:
    """Cut the client's connection now (an RST, like a crashed or restarted engine)."""
    transport = request.scope.get(TRANSPORT_SCOPE_KEY)
    if transport is None:
        raise ConnectionAbortedError("the reference engine cannot drop a connection outside its own server")
    transport.abort()
    for _ in range(3):  # let the server notice, so nothing more is written on this connection
        await asyncio.sleep(0)


def effective_sampling(config: EngineConfig, body: dict[str, Any]) -> dict[str, Any]:
    """The sampling values vLLM would use: the request's, else the model's generation config's,
    else vLLM's neutral defaults."""
    defaults = config.generation_config.sampling_defaults() if config.generation_config else {}
    defaults.pop("max_tokens", None)
    return {name: body[name] if body.get(name) is not None else defaults.get(name, neutral)
            for name, neutral in NEUTRAL_SAMPLING.items()}


def max_tokens_for(config: EngineConfig, chat: ChatRequest, prompt_len: int) -> int | Response:
    """vLLM 0.32's length rules: a 400 for a prompt longer than the context or a ``max_tokens``
    above ``max_model_len``; otherwise the budget is clamped to what the context has left."""
    limit = config.max_model_len
    if prompt_len >= limit:
        return error_response(400, f"This model's maximum context length is {limit} tokens. However, your prompt "
                              f"contains {prompt_len} input tokens, which exceeds this limit even without any "
                              "output tokens. Please reduce the length of the input prompt.", "input_tokens")
    requested = chat.max_completion_tokens or chat.max_tokens
    if requested is not None and requested > limit:
        return error_response(400, f"max_tokens={requested} cannot be greater than max_model_len={limit}. Please "
                              f"request fewer output tokens. (parameter=max_tokens, value={requested})",
                              "max_tokens")
    if requested is None and config.generation_config is not None:
        requested = config.generation_config.max_new_tokens
    room = limit - prompt_len
    return room if requested is None else min(requested, room)


async def _generate(state: EngineState, spec: ReplySpec) -> int:
    """Pace a non-streamed generation through the fence; returns how many tokens were produced."""
    fence, config = state.fence, state.config
    generation = await fence.admit()
    emitted = 0
    try:
        if config.prefill_delay_s:
            await generation.wait_aborted(config.prefill_delay_s)
        for _ in spec.token_ids:
            if not await fence.step(generation, config.decode_delay_s):
                spec.finish_reason = "abort"
                break
            emitted += 1
    finally:
        fence.release(generation)
    return emitted


async def _stream(state: EngineState, spec: ReplySpec, request: Request, drop: bool) -> AsyncIterator[bytes]:
    """Token chunks through the fence. A token is sent once the next step is known, so an abort
    lands on the last token's chunk (``finish_reason: "abort"``), as vLLM merges its final output
    into the pending one; an abort before any token sends no finish chunk at all, like vLLM."""
    fence, config = state.fence, state.config
    encoder = StreamEncoder(state.tokenizer, spec)
    drop_after = max(1, len(spec.token_ids) // 2) if drop else None
    generation = await fence.admit()
    try:
        if config.prefill_delay_s:
            await generation.wait_aborted(config.prefill_delay_s)
        yield encoder.first()
        pending: int | None = None
        aborted = generation.aborted
        for position in range(len(spec.token_ids)):
            if aborted or not await fence.step(generation, config.decode_delay_s):
                aborted = True
                break
            if pending is not None:
                yield encoder.token(pending)
                if drop_after is not None and pending + 1 >= drop_after:
                    await drop_connection(request)
                    return
            pending = position
        if pending is not None:
            yield encoder.token(pending, "abort" if aborted else None)
        elif not spec.token_ids and not aborted:
            yield encoder.closing(spec.finish_reason)
        if spec.include_usage:
            yield encoder.usage(0 if pending is None else pending + 1)
        yield encoder.done()
    finally:
        fence.release(generation)


async def chat_completions(state: EngineState, request: Request) -> Response:
    config = state.config
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"Invalid JSON body: {exc}")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object")
    session = request.headers.get(SESSION_HEADER)
    entry = state.record(session=session, model=body.get("model"), path=request.url.path,
                         headers=dict(request.headers), body=body)
    try:
        chat = ChatRequest.model_validate(body)
    except ValidationError as exc:
        return error_response(400, validation_message(exc))
    if (chat.n or 1) != 1:
        return error_response(400, "The reference engine samples one choice per request (n must be 1)", "n")
    if chat.stream_options is not None and not chat.stream:
        return error_response(400, "Stream options can only be defined when `stream=True`. "
                              "(parameter=stream_options)", "stream_options")
    refused = empty_tools(config, chat)
    if refused is not None:
        return refused
    if config.strict_model_name and not state.knows_model(chat.model):
        return error_response(404, f"The model `{chat.model}` does not exist. Valid aliases: "
                              f"{config.served_model_name}.", "model")

    keys = state.keys_for(session, chat.model)
    script_key, script = state.script_for(keys)
    choice = choose_turn(body, script)
    entry.update(turn_index=choice.index, turn_kind=choice.kind)
    fault: Fault | None = state.faults.take(keys, choice.index, choice.kind == "aux")
    if fault is not None and fault.latency_s:
        await asyncio.sleep(fault.latency_s)
    if fault is not None and fault.status is not None:
        return Response(dumps(fault.error_response_body(dict(request.headers))), status_code=fault.status,
                        media_type="application/json", headers=fault.error_headers())
    if fault is not None and fault.drop and not chat.stream:
        await drop_connection(request)
        return Response(status_code=500)

    try:
        prompt = render_prompt(config, state.template, state.tokenizer, messages=chat.messages, tools=chat.tools,
                               add_generation_prompt=chat.add_generation_prompt,
                               chat_template_kwargs=chat.chat_template_kwargs, route="chat")
    except MessageError as exc:
        return error_response(400, str(exc), exc.param)
    budget = max_tokens_for(config, chat, len(prompt.ids))
    if isinstance(budget, Response):
        return budget
    sampling = effective_sampling(config, body)
    scale = logprob_scale(config.logprobs_mode, float(sampling["temperature"]))
    try:
        sample = as_reported(sample_turn(choice, script, script_key, state.tokenizer, state.template, budget), scale)
    except ValueError as exc:
        return error_response(500, f"the scripted turn cannot be sampled: {exc}")
    # what was sampled and with which settings, for tests that check a recorder stored exactly this
    entry.update(sampled={"prompt_token_ids": prompt.ids, "token_ids": list(sample.token_ids),
                          "logprobs": list(sample.logprobs)},
                 sampling={**sampling, "max_tokens": budget})
    tokens_as_ids = chat.return_tokens_as_token_ids
    spec = ReplySpec(
        request_id=new_id(),
        created=int(time.time()),
        model=chat.model or config.served_model_name,
        key=script_key,
        turn_index=choice.index,
        prompt_ids=prompt.ids,
        token_ids=sample.token_ids,
        logprobs=sample.logprobs,
        finish_reason=sample.finish_reason,
        system_fingerprint=state.system_fingerprint,
        prompt_text=prompt.text if chat.return_prompt_text else None,
        return_token_ids=bool(chat.return_token_ids),
        want_logprobs=bool(chat.logprobs),
        top_logprobs=chat.top_logprobs or 0,
        logprob_scale=scale,
        tokens_as_ids=config.return_tokens_as_token_ids if tokens_as_ids is None else tokens_as_ids,
        reasoning_field=config.reasoning_field,
        parse_tools=bool(chat.tools) and chat.tool_choice != "none",
        tool_choice_required=bool(chat.tools) and chat.tool_choice == "required",
        tool_parser=config.tool_call_parser,
        parse_reasoning=config.reasoning_parser is not None,
        open_think=prompt.open_think,
        include_usage=bool(chat.stream_options and chat.stream_options.include_usage),
        missing_token_ids=bool(fault and fault.missing_token_ids),
        logprob_mismatch=bool(fault and fault.logprob_mismatch),
        usage_mismatch=bool(fault and fault.usage_mismatch),
        nan_logprob=bool(fault and fault.nan_logprob),
        weight_versions_key=config.chat_weight_versions,
        weight_versions=state.weight_version if config.chat_weight_versions and chat.return_weight_versions else None,
    )
    if chat.stream:
        stream = _stream(state, spec, request, drop=bool(fault and fault.drop))
        return StreamingResponse(stream, media_type="text/event-stream")
    emitted = await _generate(state, spec)
    return Response(dumps(completion_body(state.tokenizer, spec, emitted)), media_type="application/json")
