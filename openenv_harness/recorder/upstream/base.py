"""Engines as transports: what the recorder needs from whatever produces tokens.

Why an abstraction: the recorder's flow is the same whether tokens come from a vLLM server over
HTTP (loop-owning training, D2) or from the trainer's own ``ModelStep`` in-process (RFC 005
white-box mode, D8). Each upstream takes the chat body the recorder decided to send and returns a
reply in vLLM's OpenAI shape (top-level ``prompt_token_ids``, ``choices[i].token_ids``,
``choices[i].logprobs.content``), or raises ``UpstreamFailure`` when no reply came at all.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any


class UpstreamFailure(Exception):
    """No HTTP answer from the engine: ``kind`` is ``connect``, ``timeout`` or ``protocol``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass
class UpstreamReply:
    """What the engine answered. ``json`` is the parsed body when it was a JSON object.

    ``prompt_span``, when set, is the raw text of the reply's ``prompt_token_ids`` list (then ``None``
    in ``json``): the flow reads it into ids with its session's ``PromptIdsReader``
    (``reply_parse.py``), without a Python int per id and without parsing the shared history again.
    """

    status: int
    json: dict[str, Any] | None
    prompt_span: bytes | None = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    elapsed_ms: float = 0.0
    #: why the evidence cannot be trusted although the reply parses (a token key given twice):
    #: validation adds these to its reasons (``reply_parse.duplicated_token_keys``)
    doubts: list[str] = field(default_factory=list)


class Upstream(abc.ABC):
    """An engine the recorder forwards chat calls to."""

    #: Short description for provenance, e.g. ``vllm-http:http://127.0.0.1:8000``.
    name: str = "upstream"
    #: Whether ``post_for_session`` reaches an engine's render / generate / derender routes (HTTP
    #: engines); a ``ModelStep`` takes messages, not prompt ids, so incremental calls fall back.
    exact_ids: bool = False

    #: the engine family whose wire this upstream speaks (``sglang.py`` maps the recorder's routes onto SGLang's)
    family: str = "vllm"

    def served_by(self, route: str) -> str:
        """The engine route that really serves one of the recorder's routes (recorded as provenance)."""
        return route

    async def start(self) -> None:
        """Acquire resources bound to the running event loop."""

    async def aclose(self) -> None:
        """Release them."""

    @abc.abstractmethod
    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        """Send one chat completion (never streamed) and return the engine's answer. ``affinity`` is
        the session's trajectory key: HTTP engines send it in the routing header (``X-Session-ID``),
        so a router's consistent hashing keeps every call of a trajectory on one replica."""

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> UpstreamReply:
        """Engine control and introspection (``/version``, ``/tokenize``, ``/pause`` ...)."""
        raise UpstreamFailure("protocol", f"{self.name} does not support {method} {path}")

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        """A session's call to another engine route (render, generate, derender): like ``chat``, it
        carries the session, so engines that route or script by session see it."""
        return await self.request("POST", path, json=body)


#: What an engine's error shows in place of the recorder's engine API key.
REDACTED_KEY = b"[engine API key]"


def redact_key(raw: bytes, api_key: str | None) -> bytes:
    """An engine's error reply without the recorder's API key in it.

    Why: some engines and gateways quote the request's headers in an error ("invalid token: Bearer
    sk-..."), and an engine's error is relayed to the agent and kept in the failed call's record.
    The key must reach neither. Only error replies are scanned (a 200's ids are not text)."""
    if not api_key or api_key.encode() not in raw:
        return raw
    return raw.replace(api_key.encode(), REDACTED_KEY)


def check_engine_url(url: str) -> None:
    """An engine URL names a place, never a credential: it is shown in provenance, health and errors."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or parts.query:
        raise ValueError("the engine URL must not carry credentials or a query (it is shown in every record's "
                         "provenance): give the engine's key as engine_api_key (OEH_ENGINE_API_KEY)")
