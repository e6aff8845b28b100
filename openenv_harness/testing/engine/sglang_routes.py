"""The SGLang flavour's routes (``EngineConfig.family == "sglang"``): SGLang 0.5.23's HTTP server, over the
engine's scripted policy, tokenizer, template and parsers.

Why a flavour rather than a second test double: the recorder's SGLang adapter must meet SGLang's wire
(field names, where each value sits: ``sglang_wire``) while everything a test scripts -- turns, tool
calls, reasoning, faults of timing, weight syncs -- stays one thing. Served: ``POST /v1/chat/completions``
(non-streamed), ``POST /generate`` (one prompt of ids or text, non-streamed), ``POST /v1/tokenize`` and
``/tokenize``, ``POST /v1/detokenize`` and ``/detokenize``, ``POST /parse_function_call``, ``POST
/separate_reasoning``, ``GET /model_info``, ``GET /server_info``, ``GET /health``, ``GET
/health_generate``, ``GET /v1/models``, and the control routes ``POST /pause_generation``, ``POST
/continue_generation``, ``POST /update_weights_from_disk``, ``POST /update_weight_version``, ``GET|POST
/flush_cache``. vLLM's own routes are not served (404). Every request is logged as received
(``/_ref/requests``), unknown keys included: SGLang's models ignore them silently.
"""

from __future__ import annotations

from dataclasses import replace

import time
from typing import Any, Literal, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv_harness.testing.engine.chat import effective_sampling
from openenv_harness.testing.engine.config import SESSION_HEADER
from openenv_harness.testing.engine.messages import MessageError
from openenv_harness.testing.engine.weights import fault_answer, take_route_fault
from openenv_harness.testing.engine.parser import parse_output
from openenv_harness.testing.engine.policy import choose_turn
from openenv_harness.testing.engine.prompt import render_prompt
from openenv_harness.testing.engine.sglang_runtime import SGLANG_VERSION, SGLangRuntime
from openenv_harness.testing.engine.sglang_wire import (
    ChatOptions,
    Generation,
    chat_body,
    error_body,
    generate_body,
    meta_info,
    tool_call_items,
)
from openenv_harness.testing.engine.state import EngineState
from openenv_harness.testing.engine.wire import dumps, output_text

#: SGLang's sampling parameters (``sglang.api.v1.api_types.SamplingParams``; unknown keys are refused)
SAMPLING_KEYS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                 "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                 "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                 "custom_params", "beam_width", "watermark", "choice")
DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams' default


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatBody(_Body):
    messages: list[dict[str, Any]]
    model: str = "default"
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    temperature: float | None = None
    return_prompt_token_ids: bool = False
    return_token_ids: bool = False
    return_meta_info: bool = False
    separate_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    rid: str | None = None
    #: the prompt as ids: SGLang samples from them as given, the messages only set stops and parsing
    input_ids: list[int] | None = None


class GenerateBody(_Body):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    rid: str | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False


class TokenizeBody(_Body):
    prompt: str | list[str] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeBody(_Body):
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class ParseFunctionCallBody(_Body):
    text: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_parser: str | None = None


class SeparateReasoningBody(_Body):
    text: str
    reasoning_parser: str
    return_blocks: bool = False


class PauseBody(_Body):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class WeightsFromDiskBody(_Body):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class WeightVersionBody(_Body):
    new_version: str
    abort_all_requests: bool = True


def _json(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400, err_type: str = "BadRequestError") -> Response:
    return _json(error_body(message, status, err_type), status)


async def _parse(state: EngineState, request: Request, model: type[_Body]) -> tuple[_Body, dict[str, Any]] | Response:
    """Log the body as received, then validate it; a 400 in SGLang's validation-error shape."""
    raw = await request.body()
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        return _error(f"JSON decode error: {exc}", err_type="Bad Request")
    state.record(session=request.headers.get(SESSION_HEADER), model=body.get("model") if isinstance(body, dict) else None,
                 path=request.url.path, headers=dict(request.headers), body=body)
    try:
        return model.model_validate(body), body
    except ValidationError as exc:
        return _error(f"{exc} {exc.errors(include_url=False)}", err_type="Bad Request")


def add_sglang_routes(app: FastAPI, state: EngineState) -> SGLangRuntime:
    """Serve SGLang 0.5.23's routes on ``app``; returns the runtime they share."""
    runtime = SGLangRuntime(state)
    config, tokenizer = state.config, state.tokenizer

    def script_for(request: Request, model: str | None) -> tuple[str, Any]:
        return state.script_for(state.keys_for(request.headers.get(SESSION_HEADER), model))

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Response:
        parsed = await _parse(state, request, ChatBody)
        if isinstance(parsed, Response):
            return parsed
        chat, body = parsed
        assert isinstance(chat, ChatBody)
        if chat.stream:
            if chat.return_prompt_token_ids or chat.return_meta_info:
                flag = "return_prompt_token_ids" if chat.return_prompt_token_ids else "return_meta_info"
                return _error(f"{flag} is not supported with streaming. Please set stream=false when using {flag}=true.")
            return _error("The reference engine's SGLang flavour answers chat without streaming (stream=false)")
        if chat.n != 1:
            return _error("The reference engine samples one choice per request (n must be 1)")
        try:
            prompt = render_prompt(config, state.template, tokenizer, messages=chat.messages, tools=chat.tools or None,
                                   add_generation_prompt=True, chat_template_kwargs=chat.chat_template_kwargs,
                                   route="chat")
        except MessageError as exc:
            return _error(str(exc))
        if chat.input_ids is not None:
            prompt = replace(prompt, ids=list(chat.input_ids))
        if len(prompt.ids) >= config.max_model_len:
            return _error(f"The input ({len(prompt.ids)} tokens) is longer than the model's context length "
                          f"({config.max_model_len} tokens).")
        key, script = script_for(request, chat.model)
        choice = choose_turn(body, script)
        temperature = float(effective_sampling(config, body)["temperature"])
        gen = runtime.sample(choice, script, key, prompt.ids, chat.max_completion_tokens or chat.max_tokens,
                             temperature, chat.rid)
        await runtime.run(gen)
        meta = meta_info(tokenizer, gen, weight_version=state.weight_version, now=time.time(),
                         return_logprob=chat.logprobs, top_logprobs_num=chat.top_logprobs or 0, text_in_logprobs=True)
        parse_tools = bool(chat.tools) and chat.tool_choice != "none"
        parsed_text = parse_output(output_text(tokenizer, gen.output_ids), parse_tools,
                                   tool_parser=config.tool_call_parser,
                                   reasoning=config.reasoning_parser is not None and chat.separate_reasoning,
                                   open_think=prompt.open_think)
        options = ChatOptions(model=chat.model, return_prompt_token_ids=chat.return_prompt_token_ids,
                              return_token_ids=chat.return_token_ids, return_meta_info=chat.return_meta_info,
                              logprobs=chat.logprobs)
        return _json(chat_body(tokenizer, gen, meta, parsed_text, options, int(time.time())))

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def _generate(request: Request) -> Response:
        parsed = await _parse(state, request, GenerateBody)
        if isinstance(parsed, Response):
            return parsed
        obj, body = parsed
        assert isinstance(obj, GenerateBody)
        params = obj.sampling_params or {}
        unknown = [k for k in params if k not in SAMPLING_KEYS]
        if unknown:  # SGLang's JSON contract gate
            listed = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            return _json({"error": f"unknown field `{unknown[0]}`, expected one of {listed}"}, 400)
        if (obj.text is None) == (obj.input_ids is None):
            return _json({"error": {"message": "Either text or input_ids should be provided."}}, 400)
        if obj.stream:
            return _json({"error": {"message": "The reference engine's SGLang flavour answers /generate without "
                                               "streaming (stream=false)"}}, 400)
        ids = obj.input_ids if obj.input_ids is not None else tokenizer.encode(obj.text or "")
        if any(not 0 <= t < tokenizer.vocab_size for t in ids):
            return _json({"error": {"message": f"Token id out of vocabulary in input_ids (size {tokenizer.vocab_size})"}}, 400)
        if len(ids) >= config.max_model_len:
            return _json({"error": {"message": f"The input ({len(ids)} tokens) is longer than the model's context "
                                               f"length ({config.max_model_len} tokens)."}}, 400)
        key, script = script_for(request, None)
        choice = choose_turn(state.prompt_reader.turn_body(ids), script)
        max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        temperature = params.get("temperature")
        gen = runtime.sample(choice, script, key, ids, max_new, 1.0 if temperature is None else float(temperature),
                             obj.rid)
        await runtime.run(gen)
        meta = meta_info(tokenizer, gen, weight_version=state.weight_version, now=time.time(),
                         return_logprob=obj.return_logprob, top_logprobs_num=obj.top_logprobs_num,
                         logprob_start_len=obj.logprob_start_len, text_in_logprobs=obj.return_text_in_logprobs)
        skip = params.get("skip_special_tokens", True) is not False
        text = output_text(tokenizer, gen.output_ids) if skip else tokenizer.decode(gen.output_ids)
        return _json(generate_body(text, gen, meta, obj.return_prompt_token_ids))

    async def _tokenize(request: Request) -> Response:
        parsed = await _parse(state, request, TokenizeBody)
        if isinstance(parsed, Response):
            return parsed
        obj = parsed[0]
        assert isinstance(obj, TokenizeBody)
        if (obj.prompt is None) == (obj.messages is None):
            return _error("Exactly one of 'prompt' or 'messages' must be provided.", err_type="Bad Request")
        tokens: list[int] | list[list[int]]
        count: int | list[int]
        if obj.messages is not None:
            try:
                tokens = render_prompt(config, state.template, tokenizer, messages=obj.messages, tools=obj.tools or None,
                                       add_generation_prompt=obj.add_generation_prompt is not False,
                                       chat_template_kwargs=obj.chat_template_kwargs, route="chat").ids
            except MessageError as exc:
                return _error(str(exc))
            count = len(tokens)
        elif isinstance(obj.prompt, str):
            tokens = tokenizer.encode(obj.prompt)
            count = len(tokens)
        else:
            tokens = [tokenizer.encode(p) for p in obj.prompt or []]
            count = [len(t) for t in tokens]
        return _json({"tokens": tokens, "count": count, "max_model_len": config.max_model_len})

    async def _detokenize(request: Request) -> Response:
        parsed = await _parse(state, request, DetokenizeBody)
        if isinstance(parsed, Response):
            return parsed
        obj = parsed[0]
        assert isinstance(obj, DetokenizeBody)

        def text(ids: list[int]) -> str:
            known = [t for t in ids if 0 <= t < tokenizer.vocab_size]
            return output_text(tokenizer, known) if obj.skip_special_tokens else tokenizer.decode(known)

        if obj.tokens and isinstance(obj.tokens[0], list):
            return _json({"text": [text(ids) for ids in obj.tokens if isinstance(ids, list)]})
        return _json({"text": text([t for t in obj.tokens if isinstance(t, int)])})

    for path in ("/v1/tokenize", "/tokenize"):
        app.add_api_route(path, _tokenize, methods=["POST"])
    for path in ("/v1/detokenize", "/detokenize"):
        app.add_api_route(path, _detokenize, methods=["POST"])

    @app.post("/parse_function_call")
    async def _parse_function_call(request: Request) -> Response:
        parsed = await _parse(state, request, ParseFunctionCallBody)
        if isinstance(parsed, Response):
            return parsed
        obj = parsed[0]
        assert isinstance(obj, ParseFunctionCallBody)
        if obj.tool_call_parser not in (None, runtime.tool_call_parser):
            return _error(f"Unsupported tool_call_parser {obj.tool_call_parser!r}: this engine parses "
                          f"{runtime.tool_call_parser}", err_type="400")
        out = parse_output(obj.text, True, tool_parser=config.tool_call_parser, reasoning=False)
        return _json({"normal_text": out.content or "", "calls": tool_call_items(out, obj.tools)})

    @app.post("/separate_reasoning")
    async def _separate_reasoning(request: Request) -> Response:
        parsed = await _parse(state, request, SeparateReasoningBody)
        if isinstance(parsed, Response):
            return parsed
        obj = parsed[0]
        assert isinstance(obj, SeparateReasoningBody)
        if obj.reasoning_parser != runtime.reasoning_parser:
            return _error(f"Unsupported reasoning_parser {obj.reasoning_parser!r}: this engine parses "
                          f"{runtime.reasoning_parser}", err_type="400")
        out = parse_output(obj.text, False, reasoning=True)
        reasoning, text = out.reasoning or "", out.content or ""
        reply: dict[str, Any] = {"reasoning_text": reasoning, "text": text}
        if obj.return_blocks:
            blocks = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": text}]
            reply.update(reasoning_blocks=[reasoning] if reasoning else [], text_blocks=[text], blocks=blocks)
        return _json(reply)

    _add_info_routes(app, state, runtime)
    _add_control_routes(app, state, runtime)
    return runtime


def _add_info_routes(app: FastAPI, state: EngineState, runtime: SGLangRuntime) -> None:
    config = state.config

    @app.get("/model_info")
    async def _model_info() -> Response:
        faulted = fault_answer(await take_route_fault(state, "/model_info"))
        if faulted is not None:
            return faulted
        return _json({"model_path": state.weights.path or state.model_root, "served_model_name": config.served_model_name,
                      "tokenizer_path": state.model_root, "is_generation": True, "preferred_sampling_params": None,
                      "weight_version": state.weight_version, "load_format": "auto",
                      "reasoning_parser": runtime.reasoning_parser, "tool_call_parser": runtime.tool_call_parser,
                      "disaggregation_mode": "null", "has_image_understanding": False,
                      "has_audio_understanding": False, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})

    @app.get("/server_info")
    async def _server_info() -> Response:
        return _json({"model_path": state.model_root, "served_model_name": config.served_model_name,
                      "context_length": config.max_model_len, "tool_call_parser": runtime.tool_call_parser,
                      "reasoning_parser": runtime.reasoning_parser, "startup_time": runtime.started,
                      "internal_states": [{"weight_version": state.weight_version}], "version": SGLANG_VERSION,
                      "frontend": "python"})

    @app.get("/health")
    @app.get("/health_generate")
    async def _health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def _models() -> Response:
        card = {"id": config.served_model_name, "object": "model", "created": int(runtime.started),
                "owned_by": "sglang", "root": config.served_model_name, "parent": None,
                "max_model_len": config.max_model_len}
        return _json({"object": "list", "data": [card]})


_ControlBody = TypeVar("_ControlBody", bound=_Body)


async def _control(state: EngineState, request: Request, model: type[_ControlBody],
                   error_body: dict[str, Any] | None = None) -> _ControlBody | Response:
    """A control route's body, logged and validated, unless a fault scripted for the route answers instead
    (``error_body``: the route's own error body for an injected status)."""
    parsed = await _parse(state, request, model)
    if isinstance(parsed, Response):
        return parsed
    faulted = fault_answer(await take_route_fault(state, request.url.path), error_body)
    if faulted is not None:
        return faulted
    assert isinstance(parsed[0], model)
    return parsed[0]


def _add_control_routes(app: FastAPI, state: EngineState, runtime: SGLangRuntime) -> None:
    @app.post("/pause_generation")
    async def _pause(request: Request) -> Response:
        pause = await _control(state, request, PauseBody)
        if isinstance(pause, Response):
            return pause
        await runtime.pause(pause.mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def _continue(request: Request) -> Response:
        answered = await _control(state, request, _Body)
        if isinstance(answered, Response):
            return answered
        runtime.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/update_weights_from_disk")
    async def _update_weights(request: Request) -> Response:
        obj = await _control(state, request, WeightsFromDiskBody,
                             {"success": False, "message": "injected failure", "num_paused_requests": 0})
        if isinstance(obj, Response):
            return obj
        if obj.abort_all_requests:
            runtime.abort_all()
        async with state.weights.core:
            await runtime.wait_idle()
            failure = runtime.load_weights(obj.model_path)
            if failure is not None:
                return _json({"success": False, "message": failure, "num_paused_requests": 0}, 400)
            if obj.flush_cache:
                runtime.flush_cache()
            message = "Succeeded to update model weights."
            if obj.weight_version is not None:
                runtime.set_version(obj.weight_version)
                message += f" Weight version updated to {obj.weight_version}."
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/update_weight_version")
    async def _update_weight_version(request: Request) -> Response:
        obj = await _control(state, request, WeightVersionBody,
                             {"success": False, "message": "Failed to update weight version: injected"})
        if isinstance(obj, Response):
            return obj
        if obj.abort_all_requests:
            runtime.abort_all()
        runtime.set_version(obj.new_version)
        return _json({"success": True, "message": f"Weight version updated to {obj.new_version}",
                      "new_version": obj.new_version})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def _flush_cache(request: Request) -> Response:
        state.record(session=None, model=None, path=request.url.path, headers=dict(request.headers), body=None)
        fault = await take_route_fault(state, "/flush_cache")
        if fault is not None and fault.status is not None:
            return Response("Flush cache failed.\n", status_code=fault.status)
        if runtime.flush_cache():
            return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                            "waiting requests, the operation will not be performed.)\n", status_code=200)
        return Response("Flush cache failed.\n", status_code=400)


__all__ = ["Generation", "SGLangRuntime", "add_sglang_routes"]
