"""Load generator: N concurrent agents, each running back-to-back multi-turn tool-calling conversations.

Each conversation is shaped like a coding agent's (Pi's wire format): a system prompt, a user turn
with text parts, then per turn the assistant's tool call (echoed exactly as the server returned
it) and a ~2 KB tool result, with a tool manifest on every call. Every reply is checked -- a
non-200, a malformed body or a stream without ``[DONE]`` is an error -- and the conversation can
only continue from what the reply really said, so a broken proxy cannot look fast.

Targets differ only in how a conversation gets its key:

- ``direct``: the engine itself, asked for the same evidence a proxy asks for (``logprobs``,
  ``top_logprobs: 0``, ``return_token_ids``); replies must carry ``prompt_token_ids`` and ``token_ids``.
- ``recorder``: ``POST /admin/sessions`` per conversation, the secret as Bearer key on the session's
  ``base_url``, ``POST /admin/sessions/{id}/close`` at the end (what a trainer does).
- ``capture``: OpenEnv's capture server, ``POST /sessions`` per conversation, session id as key.
- ``floor``: ``floor_proxy.py``, the baseline proxy; sessions as for capture.

Timing: latency runs from sending a request to having read its whole body (the client's JSON parse
is not timed). The deadline is checked only between conversations, so every conversation runs all
its turns and the prompt-size mix is the same for every target. Request bodies are pre-serialized
by joining bytes, to keep the generator's own CPU per call low.

Prints one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "fake-model"
USER_CHARS = 64
#: Render overhead of the first prompt with the lean engine: [SYS] .. [EOS] [USER] 16 ids [EOS] [ASSISTANT].
FIRST_PROMPT_OVERHEAD = 5 + USER_CHARS // 4

_WORDS = (
    "def return self import from class value result data path file line error test config module "
    "function object list dict string index count buffer stream token prompt session record store "
    "request response engine server client async await yield None True False raise except assert "
    "print format parse write read open close update delete create build check handle process"
).split()

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": required,
                       "properties": {p: {"type": "string", "description": f"The {p}."} for p in required}}}}
    for name, description, required in (
        ("read", "Read the contents of a file. Output is truncated to 2000 lines or 50KB.", ["path"]),
        ("bash", "Execute a bash command in the current working directory. Returns stdout and stderr.", ["command"]),
        ("edit", "Edit a file by replacing exact text. The old text must match exactly.", ["path", "old", "new"]),
    )
]


def text_pool(seed: int, size: int = 1 << 20) -> str:
    """ASCII pseudo-prose (compresses like text, never like a repeated byte)."""
    rng = random.Random(seed)
    words = rng.choices(_WORDS, k=size // 5)
    return (" ".join(words) + "\n")[:size]


@dataclass
class Target:
    kind: str  # direct | recorder | capture | floor
    url: str
    admin_token: str | None = None


@dataclass
class Stats:
    latencies_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: calls that opened a new connection (the pool had none idle) and those that reused one
    new_connections: int = 0
    reused_connections: int = 0
    #: time spent opening connections, per call that opened one
    connect_ms: list[float] = field(default_factory=list)
    first_send: float | None = None
    last_done: float = 0.0
    conversations: int = 0
    session_ids: list[str] = field(default_factory=list)


class ReplyError(Exception):
    pass


def parse_sse(raw: bytes) -> dict[str, Any]:
    """Reassemble a streamed chat completion into ``{message, finish_reason, usage}``."""
    frames = [f for f in raw.split(b"\n\n") if f.strip()]
    if not frames or frames[-1].strip() != b"data: [DONE]":
        raise ReplyError("stream did not end with data: [DONE]")
    content, finish, usage, prompt_ids = "", None, None, None
    calls: dict[int, dict[str, Any]] = {}
    for frame in frames[:-1]:
        line = frame.strip()
        if line.startswith(b":"):
            continue  # SSE comment (keep-alive)
        if not line.startswith(b"data: "):
            raise ReplyError(f"bad SSE frame {line[:80]!r}")
        chunk = orjson.loads(line[6:])
        if "error" in chunk:
            raise ReplyError(f"error in stream: {str(chunk['error'])[:200]}")
        usage = chunk.get("usage") or usage
        prompt_ids = chunk.get("prompt_token_ids") or prompt_ids
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
    return {"message": message, "finish_reason": finish, "usage": usage, "prompt_token_ids": prompt_ids}


def check_reply(kind: str, raw: bytes, stream: bool) -> tuple[dict[str, Any], int]:
    """The assistant message to echo next turn and the prompt size; raises ``ReplyError``."""
    if stream:
        got = parse_sse(raw)
        message, finish, usage = got["message"], got["finish_reason"], got["usage"]
        if kind == "direct" and not got["prompt_token_ids"]:
            raise ReplyError("engine stream lacks prompt_token_ids")
    else:
        body = orjson.loads(raw)
        choice = (body.get("choices") or [None])[0]
        if not isinstance(choice, dict):
            raise ReplyError("reply has no choice")
        message, finish, usage = choice.get("message") or {}, choice.get("finish_reason"), body.get("usage")
        if kind == "direct":
            prompt, ids = body.get("prompt_token_ids"), choice.get("token_ids")
            if not prompt or not ids:
                raise ReplyError("engine reply lacks prompt_token_ids / token_ids")
            if usage and (len(prompt) != usage.get("prompt_tokens") or len(ids) != usage.get("completion_tokens")):
                raise ReplyError("usage does not match the returned ids")
    if finish is None:
        raise ReplyError("no finish_reason")
    calls = message.get("tool_calls")
    if not calls or not calls[0].get("id") or not (calls[0].get("function") or {}).get("name"):
        raise ReplyError(f"reply has no usable tool call (finish_reason={finish!r})")
    echo = {"role": "assistant", "content": message.get("content"),
            "tool_calls": [{"id": c["id"], "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                           for c in calls]}
    prompt_tokens = int((usage or {}).get("prompt_tokens") or 0)
    return echo, prompt_tokens


class Conversation:
    """Pre-serialized growing request body of one agent conversation."""

    def __init__(self, system: str, user: str, stream: bool, evidence: bool) -> None:
        head: dict[str, Any] = {"model": MODEL, "stream": stream, "store": False, "max_completion_tokens": 4096,
                                "temperature": 1.0, "tools": TOOLS}
        if stream:
            head["stream_options"] = {"include_usage": True}
        if evidence:  # direct: ask the engine for exactly what a proxy asks it for
            head.update({"logprobs": True, "top_logprobs": 0, "return_token_ids": True})
        self._head = orjson.dumps(head)[:-1] + b',"messages":['
        self._messages = [
            orjson.dumps({"role": "system", "content": system}),
            orjson.dumps({"role": "user", "content": [{"type": "text", "text": user}]}),
        ]

    def add(self, message: dict[str, Any]) -> None:
        self._messages.append(orjson.dumps(message))

    def body(self) -> bytes:
        return self._head + b",".join(self._messages) + b"]}"


class LoadGen:
    def __init__(self, target: Target, args: argparse.Namespace) -> None:
        self.target = target
        self.args = args
        self.pool = text_pool(args.seed)
        chars = 4 * max(1, args.prompt_tokens - FIRST_PROMPT_OVERHEAD)
        self.system = (self.pool * (1 + chars // len(self.pool)))[:chars]
        self.stats = Stats()
        self.started = 0
        self.deadline = 0.0

    def _admin_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.target.admin_token}"} if self.target.admin_token else {}

    async def open_session(self, http: aiohttp.ClientSession, number: int) -> tuple[str, str, str | None]:
        """``(chat url, api key, session id)`` for one conversation."""
        kind, base = self.target.kind, self.target.url.rstrip("/")
        if kind == "direct":
            return f"{base}/v1/chat/completions", "none", None
        if kind == "recorder":
            async with http.post(f"{base}/admin/sessions", headers=self._admin_headers(),
                                 json={"harness": "benchmark", "metadata": {"conversation": number}}) as r:
                data = await r.json(loads=orjson.loads)
                if r.status != 201:
                    raise ReplyError(f"POST /admin/sessions -> {r.status}: {str(data)[:200]}")
            return data["base_url"].rstrip("/") + "/chat/completions", data["secret"], data["session_id"]
        if kind in ("capture", "floor"):
            async with http.post(f"{base}/sessions", json={}) as r:
                data = await r.json(loads=orjson.loads)
                if r.status != 200 or data.get("capture_level") != "tokens":
                    raise ReplyError(f"POST /sessions -> {r.status}: {str(data)[:200]}")
            return f"{base}/v1/chat/completions", data["session_id"], data["session_id"]
        raise ValueError(f"unknown target kind {kind!r}")

    async def close_session(self, http: aiohttp.ClientSession, session_id: str | None) -> None:
        if self.target.kind == "recorder" and session_id:
            async with http.post(f"{self.target.url.rstrip('/')}/admin/sessions/{session_id}/close",
                                 headers=self._admin_headers()) as r:
                # read the reply to its end: a connection released with its body unread is closed
                # (with a reset), and every conversation would then cost the pool a connection
                await r.read()
                if r.status != 200:
                    raise ReplyError(f"close session -> {r.status}")

    async def conversation(self, http: aiohttp.ClientSession, number: int) -> None:
        args, stats = self.args, self.stats
        rng = random.Random(args.seed * 1_000_003 + number)
        user = f"Task {number}: fix the failing test in src/module_{number % 97}.py and explain. "
        conv = Conversation(self.system, (user + " " * USER_CHARS)[:USER_CHARS], args.stream,
                            evidence=self.target.kind == "direct")
        url, key, session_id = await self.open_session(http, number)
        if session_id:
            stats.session_ids.append(session_id)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        for turn in range(args.turns):
            body = conv.body()
            sent = time.perf_counter()
            if stats.first_send is None:
                stats.first_send = sent
            async with http.post(url, data=body, headers=headers) as resp:
                raw = await resp.read()
                status = resp.status
            done = time.perf_counter()
            stats.last_done = max(stats.last_done, done)
            if status != 200:
                raise ReplyError(f"HTTP {status} at turn {turn}: {raw[:200]!r}")
            echo, prompt_tokens = check_reply(self.target.kind, raw, args.stream)
            stats.latencies_ms.append((done - sent) * 1000.0)
            stats.prompt_tokens.append(prompt_tokens)
            stats.turns.append(turn)
            conv.add(echo)
            offset = rng.randrange(0, len(self.pool) - args.tool_bytes)
            conv.add({"role": "tool", "tool_call_id": echo["tool_calls"][0]["id"],
                      "content": self.pool[offset : offset + args.tool_bytes]})
            if args.think_s and turn + 1 < args.turns:  # the agent's tool time (and, here, the engine's latency)
                await asyncio.sleep(args.think_s * rng.uniform(0.5, 1.5))
        await self.close_session(http, session_id)
        stats.conversations += 1

    async def worker(self, http: aiohttp.ClientSession, index: int = 0) -> None:
        if self.args.think_s:  # sandboxes do not all start at once: spread the first calls over one think time
            await asyncio.sleep(random.Random(self.args.seed * 7919 + index).uniform(0, self.args.think_s))
        while time.perf_counter() < self.deadline:
            if self.args.max_conversations and self.started >= self.args.max_conversations:
                return
            number = self.started
            self.started += 1
            try:
                await self.conversation(http, number)
            except (TimeoutError, ReplyError, aiohttp.ClientError, KeyError, TypeError, ValueError) as exc:
                self.stats.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if len(self.stats.errors) > 50:
                    return

    def _trace(self) -> aiohttp.TraceConfig:
        """Counts new and reused connections and the time spent connecting: a server that closes
        idle connections makes its clients reconnect, and that shows here, not in its CPU."""
        trace, stats = aiohttp.TraceConfig(), self.stats

        async def create_start(_s: Any, ctx: Any, _p: Any) -> None:
            ctx.connect_started = time.perf_counter()

        async def create_end(_s: Any, ctx: Any, _p: Any) -> None:
            stats.new_connections += 1
            stats.connect_ms.append((time.perf_counter() - ctx.connect_started) * 1000.0)

        async def reuse(_s: Any, _ctx: Any, _p: Any) -> None:
            stats.reused_connections += 1

        trace.on_connection_create_start.append(create_start)
        trace.on_connection_create_end.append(create_end)
        trace.on_connection_reuseconn.append(reuse)
        return trace

    def _client(self) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=self.args.timeout)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[self._trace()])

    async def _own_client_worker(self, index: int) -> None:
        async with self._client() as http:
            await self.worker(http, index)

    async def run(self) -> dict[str, Any]:
        cpu0 = _cpu_s()
        self.deadline = time.perf_counter() + self.args.duration
        if self.args.connections == "per-agent":  # each agent its own pool, as separate agent processes have
            await asyncio.gather(*(self._own_client_worker(i) for i in range(self.args.sessions)))
        else:  # one pool for all: idle connections are few and rarely idle long
            async with self._client() as http:
                await asyncio.gather(*(self.worker(http, i) for i in range(self.args.sessions)))
        cpu1 = _cpu_s()
        return self.summary(cpu1 - cpu0)

    def summary(self, cpu_s: float) -> dict[str, Any]:
        s = self.stats
        lat = sorted(s.latencies_ms)
        n = len(lat)
        window = (s.last_done - s.first_send) if (s.first_send and n) else 0.0
        out: dict[str, Any] = {
            "target": self.target.kind,
            "calls": n,
            "errors": len(s.errors),
            "error_samples": s.errors[:5],
            "conversations": s.conversations,
            "window_s": window,
            "throughput": n / window if window > 0 else 0.0,
            "p50_ms": percentile(lat, 50),
            "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99),
            "max_ms": lat[-1] if lat else None,
            "new_connections": s.new_connections,
            "reused_connections": s.reused_connections,
            "connect_p99_ms": percentile(sorted(s.connect_ms), 99),
            "connect_max_ms": max(s.connect_ms) if s.connect_ms else None,
            "mean_prompt_tokens": sum(s.prompt_tokens) / n if n else 0.0,
            "max_prompt_tokens": max(s.prompt_tokens) if n else 0,
            "lg_cpu_ms_per_call": cpu_s * 1000.0 / n if n else None,
            "session_ids": s.session_ids[:1000],
        }
        if self.args.keep_calls:
            rows = zip(s.turns, s.latencies_ms, s.prompt_tokens, strict=True)
            out["per_call"] = [[t, round(ms, 4), p] for t, ms, p in rows]
        return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    rank = math.ceil(q / 100.0 * len(sorted_values)) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, rank))]


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Agent-shaped load against an engine, the recorder or OpenEnv capture")
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8011")
    p.add_argument("--target", choices=("direct", "recorder", "capture", "floor"), required=True)
    p.add_argument("--admin-token", default=None)
    p.add_argument("--sessions", type=int, default=1, help="concurrent agents")
    p.add_argument("--turns", type=int, default=20, help="calls per conversation")
    p.add_argument("--duration", type=float, default=10.0, help="seconds; checked between conversations")
    p.add_argument("--max-conversations", type=int, default=0, help="stop after this many (0: no cap)")
    p.add_argument("--prompt-tokens", type=int, default=1024, help="first prompt size (lean engine's tokens)")
    p.add_argument("--tool-bytes", type=int, default=2048)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--think-s", type=float, default=0.0, help="mean pause between an agent's calls (uniform ±50%%)")
    p.add_argument("--connections", choices=("shared", "per-agent"), default="shared",
                   help="one connection pool for all agents, or one per agent (each agent's connection then idles "
                        "through its think time, as a sandboxed agent's does)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--keep-calls", action="store_true", help="include per-call [turn, ms, prompt] rows")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    gen = LoadGen(Target(args.target, args.url, args.admin_token), args)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover
        runner = asyncio.Runner()
    with runner:
        result = runner.run(gen.run())
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
