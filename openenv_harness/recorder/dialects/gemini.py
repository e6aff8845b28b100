"""Google's ``generateContent`` dialect (Gemini CLI): routes, replies, event streams and errors.

Why the route carries state: Google's API names the model and the mode in the URL --
``POST /v1beta/models/<model>:generateContent`` answers one JSON ``GenerateContentResponse``,
``:streamGenerateContent?alt=sse`` a stream of them -- so a call's dialect is the shared one bound to
the URL's model and mode (``GeminiDialect.bound``); every step between the two ends stays the one
path. The request end is ``gemini_request.to_chat``.

The reply end turns one recorded chat completion into a ``GenerateContentResponse``: a ``thought``
part (the engine's reasoning, with a ``thoughtSignature`` we make up and remember), a ``text`` part,
one ``functionCall`` part per tool call (``args`` the parsed arguments, the call id we hand out, and
the sampled argument text remembered under it), ``finishReason`` (``STOP``, ``MAX_TOKENS``,
``SAFETY``) and ``usageMetadata``. Streamed, it is Google's SSE form -- one ``data:`` event per part,
the last with the finish reason and usage -- built in one piece after the record committed, so the
finishing event can never precede durability. Without ``alt=sse`` Google answers a JSON array; the
SDKs always ask for SSE, and that is what is served.

Errors: ``{"error": {"code", "message", "status"}}`` with Google's canonical status names, the same
HTTP status and Retry-After the flow chose; in a stream, the same object as a ``data:`` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects import gemini_request
from openenv_harness.recorder.dialects.base import Dialect, chat_message, reasoning_text
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory, reasoning_handle
from openenv_harness.recorder.errors import AgentError

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           409: "ABORTED", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED"}
_FINISH = {"length": "MAX_TOKENS", "content_filter": "SAFETY"}
#: The API versions Google's SDKs address (``GOOGLE_GENAI_API_VERSION`` picks one).
API_VERSIONS = ("v1beta", "v1", "v1alpha")
GENERATE, STREAM, COUNT = "generateContent", "streamGenerateContent", "countTokens"


def status_name(status: int) -> str:
    return _STATUS.get(status) or ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def google_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"code": status, "message": message, "status": status_name(status)}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=dict(headers or {}))


@dataclass(frozen=True)
class GeminiTarget:
    """A Google model-method path: ``(session id or None, model, method)``."""

    session_id: str | None
    model: str
    method: str


def parse_target(path: str) -> GeminiTarget | None:
    """``[/rollout/<session>]/<version>/models/<model>:<method>`` (the model may hold slashes, as
    ``Qwen/Qwen2.5-Coder`` does); None for any other path."""
    session_id: str | None = None
    rest = path
    if path.startswith("/rollout/"):
        session_id, slash, rest = path[len("/rollout/"):].partition("/")
        if not session_id or not slash:
            return None
        rest = "/" + rest
    for version in API_VERSIONS:
        prefix = f"/{version}/models/"
        if rest.startswith(prefix):
            model, colon, method = rest[len(prefix):].rpartition(":")
            if colon and model and method in (GENERATE, STREAM, COUNT):
                return GeminiTarget(session_id, model, method)
    return None


def _usage(reply: dict[str, Any]) -> dict[str, int]:
    raw_usage = reply.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    out = {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}
    raw_details = usage.get("prompt_tokens_details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    if details.get("cached_tokens"):
        out["cachedContentTokenCount"] = details["cached_tokens"]
    return out


def _args(arguments: Any) -> dict[str, Any]:
    """The parsed arguments object (``{}`` when the text is not a JSON object: the record keeps it)."""
    if isinstance(arguments, str) and arguments.strip():
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {}
        if isinstance(parsed, dict):
            return parsed
    return {}


def reply_parts(reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> list[dict[str, Any]]:
    """The parts of one chat completion's reply; remembers what replay must restore."""
    _, message = chat_message(reply)
    parts: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        handle = reasoning_handle(str(reply.get("id")), reasoning)
        memory.remember_reasoning(handle, reasoning)
        parts.append({"text": reasoning, "thought": True, "thoughtSignature": handle})
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append({"text": content})
    suffix = str(reply.get("id") or "recorded").removeprefix("chatcmpl-")
    for i, tool_call in enumerate(message.get("tool_calls") or []):
        fn = tool_call.get("function") or {}
        call_id = tool_call.get("id") or f"call_{suffix}_{i}"
        arguments = call.arguments_for(i, call_id, fn.get("arguments"), memory)
        args = _args(arguments)
        memory.remember_call(call_id, arguments if isinstance(arguments, str) else json.dumps(args), args)
        parts.append({"functionCall": {"id": call_id, "name": fn.get("name") or "", "args": args}})
    return parts


def finish_reason(reply: dict[str, Any]) -> str:
    choice, _ = chat_message(reply)
    return _FINISH.get(str(choice.get("finish_reason")), "STOP")


class GeminiDialect(Dialect):
    name: ClassVar[str] = "gemini"
    #: the model-method routes are matched by ``parse_target``; this names the family in listings
    path_suffix: ClassVar[str] = "/v1beta/models/{model}:generateContent"
    #: Gemini CLI sends no conversation header of its own; one passed with GEMINI_CLI_CUSTOM_HEADERS is read
    session_header: ClassVar[str] = "x-session-id"
    keepalive_event: ClassVar[bytes] = b": keepalive\n\n"

    def __init__(self, model: str | None = None, stream: bool = False) -> None:
        self.model = model
        self.streams = stream

    def bound(self, target: GeminiTarget) -> GeminiDialect:
        """This dialect for one call's URL: its model, and whether it streams."""
        return GeminiDialect(target.model, target.method == STREAM)

    def to_chat(self, body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
        return gemini_request.to_chat(body, memory, model=self.model, stream=self.streams)

    def _response(self, reply: dict[str, Any], call: DialectCall, parts: list[dict[str, Any]],
                  last: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        out: dict[str, Any] = {"candidates": [candidate]}
        if last:
            candidate["finishReason"] = finish_reason(reply)
            out["usageMetadata"] = _usage(reply)
        out["modelVersion"] = call.model or reply.get("model") or ""
        out["responseId"] = str(reply.get("id") or "recorded")
        return out

    def message(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> dict[str, Any]:
        return self._response(reply, call, reply_parts(reply, call, memory), last=True)

    def stream(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> bytes:
        parts = reply_parts(reply, call, memory) or [{"text": ""}]
        events = [self._response(reply, call, [part], last=i == len(parts) - 1) for i, part in enumerate(parts)]
        return b"".join(b"data: " + orjson.dumps(event) + b"\r\n\r\n" for event in events)

    def error(self, exc: AgentError) -> Response:
        return google_error(exc.status, exc.message, exc.headers)

    def stream_error(self, response: Response) -> bytes:
        """Google's in-stream error: the error object as one more ``data:`` event."""
        try:
            body = orjson.loads(bytes(response.body))
        except orjson.JSONDecodeError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            status = response.status_code
            body = {"error": {"code": status, "status": status_name(status),
                              "message": bytes(response.body).decode("utf-8", "replace")}}
        return b"data: " + orjson.dumps(body) + b"\r\n\r\n"


GEMINI = GeminiDialect()
