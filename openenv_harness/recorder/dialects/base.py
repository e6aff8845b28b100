"""A dialect: the two ends of the flow, the agent's API at each.

Why at the ends only: every guarantee the recorder gives -- canonical prompt ids, sampled ids and
logprobs, validation, a durable record before the reply, budgets, retry de-duplication, the weight
fence, provenance -- lives in the call's named steps (``call/``), and those must stay one path for
every agent. Chat Completions is a dialect too, the identity one (``chat.py``). A dialect is data in,
data out, and never sees the flow:

- ``enter``: the agent's request bytes become the chat request the steps run on -- the body and its
  bytes, so ``parse``, ``classify``, ``dedupe`` and ``record`` see a chat call like any other and the
  record's ``request`` is exactly the chat body the engine rendered and sampled from;
- ``render``: the recorded chat completion becomes the dialect's reply (JSON or the dialect's own
  event stream), built only after the record committed, so the terminal event can never precede
  durability; errors leave in the dialect's error shape (``error``, ``stream_error``).

What it declares as data: its name and route, the agent's own session header, its keepalive event,
and whether its replies hand the agent the argument text the model sampled
(``records_sampled_arguments``: the record step then keeps that text in the record).

Upstream route (why chat completions): the engine renders the translated chat request with its own
template and returns its canonical prompt ids, exactly as for a chat agent, so the recorded prompt
ids are the ids the engine sampled from -- no client-side tokenizer, no second rendering. vLLM's
native ``/v1/messages`` and ``/v1/responses`` return no token ids, and its ``render`` / ``generate``
/ ``derender`` routes need ``--enable-scale-out`` and three engine round trips per call; chat
completions works on every vLLM (and on the white-box ``ModelStep`` upstream) in one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.upstream.base import UpstreamReply


@dataclass
class Entered:
    """A request as the steps take it: the chat body, its bytes (what is digested and stored), and
    what the reply end needs."""

    body: dict[str, Any]
    raw: bytes
    call: DialectCall


def invalid(message: str, code: str = "invalid_request") -> AgentError:
    """A 400 for a request the dialect cannot read (it reaches neither the engine nor the store)."""
    return AgentError(400, message, code=code)


def decode_object(raw: bytes) -> dict[str, Any]:
    """A body the edge already bounded (``request_body.receive_body``), decoded to a JSON object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object", "invalid_body")
    return body


def sse(event: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event in the ``event:`` + ``data:`` form both dialects use."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def chat_message(reply: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first choice of a chat completion and its message (empty dicts when absent)."""
    choices = reply.get("choices") or [{}]
    choice: dict[str, Any] = choices[0] if isinstance(choices[0], dict) else {}
    found = choice.get("message")
    message: dict[str, Any] = found if isinstance(found, dict) else {}
    return choice, message


def reasoning_text(message: dict[str, Any]) -> str:
    """The engine's parsed reasoning, under either of vLLM's field names."""
    for name in ("reasoning", "reasoning_content"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


class Dialect(abc.ABC):
    """One agent API spoken at the recorder's edge."""

    #: ``responses`` | ``anthropic`` (the record's ``metadata.dialect``)
    name: ClassVar[str]
    #: The route's path after ``/rollout/<session>`` (or bare, for key-routed calls).
    path_suffix: ClassVar[str]
    #: The agent's own conversation header, recorded as ``harness_session_id``.
    session_header: ClassVar[str]
    #: What keeps a waiting stream alive (``keepalive.py``): an SSE comment unless the API has its own.
    keepalive_event: ClassVar[bytes] = b": keepalive\n\n"

    #: whether replies hand the agent the argument text the model sampled (``DialectCall.arguments_for``)
    records_sampled_arguments: ClassVar[bool] = True

    def enter(self, raw: bytes, memory: ReplayMemory) -> Entered:
        """The agent's request as the chat request the steps run on; ``AgentError`` (400/413) on what
        cannot be read."""
        body = decode_object(raw)
        chat, call = self.to_chat(body, memory)
        return Entered(chat, orjson.dumps(chat), call)

    def remember(self, record: dict[str, Any], memory: ReplayMemory) -> None:
        """Remember again what one recorded reply remembered when it left: the reply is built the
        same way from the record (its ``response`` and ``metadata.sampled_arguments``) and dropped,
        so the entries are exactly those its first sending made."""
        response = record.get("response")
        if not isinstance(response, dict):
            return
        sampled = record.get("metadata", {}).get("sampled_arguments")
        self.message(response, DialectCall(raw_arguments=list(sampled) if isinstance(sampled, list) else []), memory)

    def render(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory, *, stream: bool,
               include_usage: bool) -> Response:
        """The recorded chat completion in the dialect's own shape (a replayed retry has no engine
        reply: the memory holds what its first sending handed out)."""
        if stream:
            return Response(self.stream(reply, call, memory), media_type="text/event-stream",
                            headers={"cache-control": "no-cache"})
        return Response(orjson.dumps(self.message(reply, call, memory)), media_type="application/json")

    def models(self, engine_reply: UpstreamReply) -> Response:
        """``GET /v1/models`` as the engine answered it (a dialect with its own list shape overrides)."""
        return Response(engine_reply.body, status_code=engine_reply.status, media_type="application/json")

    @abc.abstractmethod
    def to_chat(self, body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
        """The chat request for a dialect request; raises ``AgentError`` (400) on what it cannot read."""

    @abc.abstractmethod
    def message(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> dict[str, Any]:
        """The dialect's non-streaming reply for one chat completion."""

    @abc.abstractmethod
    def stream(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> bytes:
        """The dialect's whole event stream for one chat completion."""

    @abc.abstractmethod
    def error(self, exc: AgentError) -> Response:
        """An ``AgentError`` in the dialect's error shape (same status, same Retry-After)."""

    @abc.abstractmethod
    def stream_error(self, response: Response) -> bytes:
        """An error response (from ``error``) as the dialect's in-stream error event: what a stream
        already committed to 200 by keepalives (``keepalive.py``) ends with instead."""
