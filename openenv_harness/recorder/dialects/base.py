"""A dialect: the two ends of the flow for an agent that does not speak Chat Completions.

Why at the ends only: every guarantee the recorder gives -- canonical prompt ids, sampled ids and
logprobs, validation, a durable record before the reply, budgets, retry de-duplication, the weight
fence, provenance -- lives in the flow's named steps, and those must stay one path for every agent.
So a dialect does two things and nothing else:

- ``enter``: the agent's request (Responses, Anthropic Messages) becomes the chat request the
  flow runs on -- it replaces ``flow.raw`` with that chat body's bytes, so ``parse``, ``classify``,
  ``dedupe`` and ``record`` see a chat call like any other and the record's ``request`` is exactly
  the chat body the engine rendered and sampled from;
- ``reply``: the recorded chat completion becomes the dialect's reply (JSON or the dialect's own
  event stream), built only after the record committed, so the terminal event can never precede
  durability; errors leave in the dialect's error shape.

Upstream route (why chat completions): the engine renders the translated chat request with its own
template and returns its canonical prompt ids, exactly as for a chat agent, so the recorded prompt
ids are the ids the engine sampled from -- no client-side tokenizer, no second rendering. vLLM's
native ``/v1/messages`` and ``/v1/responses`` return no token ids, and its ``render`` / ``generate``
/ ``derender`` routes need ``--enable-scale-out`` and three engine round trips per call; chat
completions works on every vLLM (and on the white-box ``ModelStep`` upstream) in one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.dialects.sampled import raw_arguments, sampled_text
from openenv_harness.recorder.errors import AgentError, body_too_large
from openenv_harness.recorder.sessions import LiveSession

if TYPE_CHECKING:
    from openenv_harness.recorder.flow import Flow


@dataclass
class DialectCall:
    """What the reply end needs from the request end of one call."""

    model: str | None = None
    echo: dict[str, Any] = field(default_factory=dict)
    #: per tool call of the reply, the argument text the model sampled (``sampled.raw_arguments``)
    raw_arguments: list[str | None] = field(default_factory=list)

    def arguments_for(self, index: int, call_id: str, parsed: Any, memory: ReplayMemory) -> Any:
        """What to hand the agent as a call's arguments: the sampled text when it is known (from
        this reply's tokens, or remembered from the first time this reply was sent), else the
        engine's parsed string."""
        if index < len(self.raw_arguments) and self.raw_arguments[index] is not None:
            return self.raw_arguments[index]
        return memory.sampled(call_id) or parsed


def invalid(message: str, code: str = "invalid_request") -> AgentError:
    """A 400 for a request the dialect cannot read (it reaches neither the engine nor the store)."""
    return AgentError(400, message, code=code)


def decode_object(raw: bytes, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise body_too_large(limit)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object", "invalid_body")
    return body


def memory_for(session: LiveSession) -> ReplayMemory:
    if session.dialect_memory is None:
        session.dialect_memory = ReplayMemory()
    return session.dialect_memory


def sse(event: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event in the ``event:`` + ``data:`` form both dialects use."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def chat_message(reply: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first choice of a chat completion and its message (empty dicts when absent)."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
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

    def enter(self, flow: "Flow") -> None:
        """Replace the agent's body in ``flow.raw`` by the chat body the flow will run on."""
        body = decode_object(flow.raw, flow.ctx.config.max_body_bytes)
        chat, call = self.to_chat(body, memory_for(flow.session))
        flow.dialect_call = call
        flow.raw = orjson.dumps(chat)

    def keep_sampled_arguments(self, flow: "Flow", response: dict[str, Any], metadata: dict[str, Any]) -> None:
        """At the record step: the argument text the model sampled for each of the reply's tool calls
        (``sampled.py``), for this reply and, as ``metadata.sampled_arguments``, for the record.

        Why in the record: the text is found in the engine reply's logprob entries, which the record
        does not keep (its ``response`` is the agent's view; its ids need the engine's tokenizer to
        be text again). A restarted recorder rebuilds the replay memory from it (``restore.py``)."""
        call = flow.dialect_call if isinstance(flow.dialect_call, DialectCall) else None
        _, message = chat_message(response)
        tool_calls = message.get("tool_calls") or []
        if call is None or flow.reply is None or not tool_calls:
            return
        call.raw_arguments = raw_arguments(sampled_text(flow.reply.json), tool_calls)
        if any(text is not None for text in call.raw_arguments):
            metadata["sampled_arguments"] = call.raw_arguments

    def remember(self, record: dict[str, Any], memory: ReplayMemory) -> None:
        """Remember again what one recorded reply remembered when it left: the reply is built the
        same way from the record (its ``response`` and ``metadata.sampled_arguments``) and dropped,
        so the entries are exactly those its first sending made."""
        response = record.get("response")
        if not isinstance(response, dict):
            return
        sampled = record.get("metadata", {}).get("sampled_arguments")
        self.message(response, DialectCall(raw_arguments=list(sampled) if isinstance(sampled, list) else []), memory)

    def reply(self, flow: "Flow") -> Response:
        """The recorded chat completion (``flow.agent_reply``) in the dialect's own shape (a replayed
        retry has no engine reply: the memory holds what its first sending handed out)."""
        assert flow.agent_reply is not None
        call = flow.dialect_call if isinstance(flow.dialect_call, DialectCall) else DialectCall()
        memory = memory_for(flow.session)
        if flow.wants_stream:
            return Response(self.stream(flow.agent_reply, call, memory), media_type="text/event-stream",
                            headers={"cache-control": "no-cache"})
        return Response(orjson.dumps(self.message(flow.agent_reply, call, memory)), media_type="application/json")

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
