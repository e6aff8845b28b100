"""``POST /v1/chat/completions``: render, "sample", pace through the fence, reply like vLLM.

The flow of one call: parse and validate the body -> log it -> pick the script and the turn ->
apply an injected fault if one matches -> render the prompt with the reference template and
encode it -> sample the scripted turn -> emit it token by token through the fence (so a pause
can land mid-generation) -> answer as JSON or as vLLM's SSE stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv_harness.testing.engine.config import SESSION_HEADER
from openenv_harness.testing.engine.faults import Fault, error_body
from openenv_harness.testing.engine.policy import choose_turn, sample_turn
from openenv_harness.testing.engine.state import EngineState
from openenv_harness.testing.engine.template import prepare_messages
from openenv_harness.testing.engine.wire import ReplySpec, StreamEncoder, completion_body, dumps, new_id

#: Where the ASGI server's transport is stashed (see ``app.EngineApp``), so a fault can cut it.
TRANSPORT_SCOPE_KEY = "openenv_harness.transport"
_RESERVED_TEMPLATE_ARGS = {"messages", "tools", "add_generation_prompt"}


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
    fence, config = state.fence, state.config
    encoder = StreamEncoder(state.tokenizer, spec)
    drop_after = max(1, len(spec.token_ids) // 2) if drop else None
    generation = await fence.admit()
    try:
        if config.prefill_delay_s:
            await generation.wait_aborted(config.prefill_delay_s)
        emitted = 0
        aborted = generation.aborted
        yield encoder.first()
        for position in range(len(spec.token_ids)):
            if aborted or not await fence.step(generation, config.decode_delay_s):
                aborted = True
                break
            yield encoder.token(position)
            emitted += 1
            if drop_after is not None and emitted >= drop_after:
                await drop_connection(request)
                return
        if aborted:
            yield encoder.closing("abort")
        elif not spec.token_ids:
            yield encoder.closing(spec.finish_reason)
        if spec.include_usage:
            yield encoder.usage(emitted)
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
    if config.strict_model_name and not state.knows_model(chat.model):
        return error_response(404, f"The model `{chat.model}` does not exist.", "model")

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
        messages = prepare_messages(chat.messages, config.tool_arguments)
        kwargs = {k: v for k, v in (chat.chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_ARGS}
        prompt = state.template.render(messages, chat.tools, chat.add_generation_prompt, **kwargs)
    except (TemplateError, ValueError, TypeError) as exc:
        return error_response(400, str(exc))
    prompt_ids = state.tokenizer.encode(prompt)
    if len(prompt_ids) >= config.max_model_len:
        return error_response(400, f"This model's maximum context length is {config.max_model_len} tokens. "
                              f"However, your request has {len(prompt_ids)} input tokens.", "input_tokens")
    max_tokens = chat.max_completion_tokens or chat.max_tokens
    if max_tokens is not None and len(prompt_ids) + max_tokens > config.max_model_len:
        return error_response(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. "
                              f"This model's maximum context length is {config.max_model_len} tokens and "
                              f"your request has {len(prompt_ids)} input tokens.", "max_tokens")
    if max_tokens is None:
        max_tokens = config.max_model_len - len(prompt_ids)

    sample = sample_turn(choice, script, script_key, state.tokenizer, state.template, max_tokens)
    # what was sampled, for tests that check a recorder stored exactly this
    entry.update(sampled={"prompt_token_ids": prompt_ids, "token_ids": list(sample.token_ids),
                          "logprobs": list(sample.logprobs)})
    include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
    tokens_as_ids = chat.return_tokens_as_token_ids
    spec = ReplySpec(
        request_id=new_id(),
        created=int(time.time()),
        model=chat.model or config.served_model_name,
        key=script_key,
        turn_index=choice.index,
        prompt_ids=prompt_ids,
        token_ids=sample.token_ids,
        logprobs=sample.logprobs,
        finish_reason=sample.finish_reason,
        return_token_ids=bool(chat.return_token_ids),
        want_logprobs=bool(chat.logprobs),
        top_logprobs=chat.top_logprobs or 0,
        tokens_as_ids=config.return_tokens_as_token_ids if tokens_as_ids is None else tokens_as_ids,
        reasoning_field=config.reasoning_field,
        parse_tools=bool(chat.tools) and chat.tool_choice != "none",
        include_usage=include_usage,
        missing_token_ids=bool(fault and fault.missing_token_ids),
        logprob_mismatch=bool(fault and fault.logprob_mismatch),
        usage_mismatch=bool(fault and fault.usage_mismatch),
        nan_logprob=bool(fault and fault.nan_logprob),
    )
    if chat.stream:
        stream = _stream(state, spec, request, drop=bool(fault and fault.drop))
        return StreamingResponse(stream, media_type="text/event-stream")
    emitted = await _generate(state, spec)
    return Response(dumps(completion_body(state.tokenizer, spec, emitted)), media_type="application/json")
