"""What a dialect costs: the same agent-shaped load through the recorder as Chat Completions, as the
Responses API (Codex's shape) and as Anthropic Messages (Claude Code's shape), one run.

    python benchmarks/bench_dialects.py                      # chain P=8k N=1 and N=16, 20 turns, 10 s cells
    python benchmarks/bench_dialects.py --quick              # ~1 min smoke
    python benchmarks/bench_dialects.py --settings chain:8192:1:20:stream

Every cell starts a fresh lean engine and a fresh recorder; the three dialects alternate per
setting (chat, responses, anthropic, then again per rep). Each conversation is the real wire shape:
chat messages with the assistant's tool call echoed; Responses ``input`` items with the output items
sent back verbatim plus a ``function_call_output``; Messages with the parsed content blocks sent back
plus a ``tool_result``. Every reply is checked (status, the dialect's terminal event when streamed,
a tool call to continue from), so a broken path cannot look fast. Reported: client latency p50/p99,
calls/s, and the recorder's CPU per call (its process tree, index process included), from /proc.

The lean engine's logprobs carry ``token_id:N`` strings, so the sampled-argument search
(``recorder/dialects/sampled.py``) stops at the first entry here; against a vLLM returning token
text it scans the completion once per call with tool calls.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import loadgen
import procs
from measure import Setting

DIALECTS = ("chat", "responses", "anthropic")
DEFAULT_SETTINGS = ["chain:8192:1", "chain:8192:16"]
QUICK_SETTINGS = ["chain:1024:1:10", "chain:1024:8:10:stream"]
SUFFIX = {"chat": "/chat/completions", "responses": "/responses", "anthropic": "/messages"}


class Reply(Exception):
    pass


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in raw.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in frame.split(b"\n") if b": " in line)
        if b"data" in lines:
            out.append(orjson.loads(lines[b"data"]))
    return out


class Conversation:
    """One agent's growing request in one dialect."""

    def __init__(self, dialect: str, system: str, user: str, stream: bool) -> None:
        self.dialect, self.stream = dialect, stream
        if dialect == "chat":
            self.body: dict[str, Any] = {"model": loadgen.MODEL, "tools": loadgen.TOOLS, "max_tokens": 4096,
                                         "messages": [{"role": "system", "content": system},
                                                      {"role": "user", "content": [{"type": "text", "text": user}]}]}
            if stream:
                self.body["stream_options"] = {"include_usage": True}
        elif dialect == "responses":
            tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                      "parameters": t["function"]["parameters"], "strict": False} for t in loadgen.TOOLS]
            self.body = {"model": loadgen.MODEL, "tools": tools, "tool_choice": "auto", "store": False,
                         "input": [{"type": "message", "role": "developer",
                                    "content": [{"type": "input_text", "text": system}]},
                                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}]}
        else:
            tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                      "input_schema": t["function"]["parameters"]} for t in loadgen.TOOLS]
            self.body = {"model": loadgen.MODEL, "max_tokens": 4096, "system": [{"type": "text", "text": system}],
                         "tools": tools, "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]}
        self.body["stream"] = stream

    def encoded(self) -> bytes:
        return orjson.dumps(self.body)

    def continue_from(self, raw: bytes, tool_output: str) -> None:
        """Read the reply, check it, and append the turn and its tool result as the agent would."""
        if self.dialect == "chat":
            message = loadgen.check_reply("recorder", raw, self.stream)[0]
            self.body["messages"] += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                                "content": tool_output}]
        elif self.dialect == "responses":
            if self.stream:
                events = _events(raw)
                if not events or events[-1]["type"] != "response.completed":
                    raise Reply("stream did not end with response.completed")
                response = events[-1]["response"]
            else:
                response = orjson.loads(raw)
            calls = [i for i in response["output"] if i["type"] == "function_call"]
            if not calls:
                raise Reply("no function_call in the response")
            self.body["input"] += [*response["output"], {"type": "function_call_output", "call_id": calls[0]["call_id"],
                                                         "output": tool_output}]
        else:
            if self.stream:
                events = _events(raw)
                if not events or events[-1]["type"] != "message_stop":
                    raise Reply("stream did not end with message_stop")
                blocks: list[dict[str, Any]] = []
                partial: dict[int, str] = {}
                for e in events:
                    if e["type"] == "content_block_start":
                        blocks.append(dict(e["content_block"]))
                    elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
                        partial[e["index"]] = partial.get(e["index"], "") + e["delta"]["partial_json"]
                    elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
                        blocks[e["index"]]["text"] += e["delta"]["text"]
                for index, text in partial.items():
                    blocks[index]["input"] = orjson.loads(text)
            else:
                blocks = orjson.loads(raw)["content"]
            uses = [b for b in blocks if b["type"] == "tool_use"]
            if not uses:
                raise Reply("no tool_use in the message")
            self.body["messages"] += [{"role": "assistant", "content": blocks}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0]["id"], "content": tool_output}]}]


async def run_cell(url: str, admin: str, dialect: str, setting: Setting, duration: float) -> dict[str, Any]:
    pool = loadgen.text_pool(7)
    chars = 4 * max(1, setting.prompt_tokens - loadgen.FIRST_PROMPT_OVERHEAD)
    system = (pool * (1 + chars // len(pool)))[:chars]
    latencies: list[float] = []
    errors: list[str] = []
    started = [0]
    deadline = time.perf_counter() + duration
    admin_headers = {"authorization": f"Bearer {admin}"}

    async def conversation(http: aiohttp.ClientSession, number: int) -> None:
        rng = random.Random(number)
        async with http.post(f"{url}/admin/sessions", headers=admin_headers, json={"harness": "benchmark"}) as r:
            session = await r.json(loads=orjson.loads)
        conv = Conversation(dialect, system, f"Task {number}: fix the failing test.", setting.stream)
        headers = {"authorization": f"Bearer {session['secret']}", "content-type": "application/json"}
        target = session["base_url"].rstrip("/") + SUFFIX[dialect]
        for _ in range(setting.turns):
            body = conv.encoded()
            sent = time.perf_counter()
            async with http.post(target, data=body, headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise Reply(f"HTTP {resp.status}: {raw[:200]!r}")
            latencies.append((time.perf_counter() - sent) * 1000.0)
            offset = rng.randrange(0, len(pool) - 2048)
            conv.continue_from(raw, pool[offset : offset + 2048])
        async with http.post(f"{url}/admin/sessions/{session['session_id']}/close", headers=admin_headers):
            pass

    async def worker(http: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline and len(errors) < 20:
            started[0] += 1
            try:
                await conversation(http, started[0])
            except (Reply, aiohttp.ClientError, KeyError, ValueError, TypeError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    window0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        await asyncio.gather(*(worker(http) for _ in range(setting.sessions)))
    window = time.perf_counter() - window0
    lat = sorted(latencies)
    return {"calls": len(lat), "errors": errors[:3], "n_errors": len(errors), "throughput": len(lat) / window,
            "p50_ms": loadgen.percentile(lat, 50), "p99_ms": loadgen.percentile(lat, 99)}


def measure_cell(dialect: str, setting: Setting, duration: float, tmp: Path) -> dict[str, Any]:
    admin = "bench-" + secrets.token_hex(16)
    with procs.engine_proc(setting.mode, setting.prompt_tokens, tmp) as engine, \
            procs.recorder_proc(engine.url, tmp / f"{dialect}-{time.time_ns()}.db", admin, tmp) as recorder:
        warm = Setting(setting.mode, setting.prompt_tokens, 2, 3, setting.stream)
        asyncio.run(run_cell(recorder.url, admin, dialect, warm, 0.5))  # pre-warm, discarded
        cpu0 = procs.tree_cpu_seconds(recorder.pid)
        result = asyncio.run(run_cell(recorder.url, admin, dialect, setting, duration))
        cpu = procs.tree_cpu_seconds(recorder.pid) - cpu0
    result["recorder_cpu_ms_per_call"] = cpu * 1000.0 / result["calls"] if result["calls"] else None
    return {"dialect": dialect, "setting": setting.label, **result}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default=None, help="comma-separated mode:P:N[:turns][:stream]")
    p.add_argument("--duration", type=float, default=None, help="seconds of load per cell (10; quick: 3)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="JSONL results (default: benchmarks/results/dialects.jsonl)")
    a = p.parse_args(argv)
    settings = [Setting.parse(s) for s in (a.settings.split(",") if a.settings else
                                           QUICK_SETTINGS if a.quick else DEFAULT_SETTINGS)]
    duration = a.duration or (3.0 if a.quick else 10.0)
    out = a.out or (Path(tempfile.gettempdir()) / "oeh-dialects.jsonl" if a.quick else
                    procs.BENCH / "results" / "dialects.jsonl")
    rows = []
    with tempfile.TemporaryDirectory(prefix="oeh-dialects-") as tmp, open(out, "w") as sink:
        for setting in settings:
            for _ in range(a.reps):
                for dialect in DIALECTS:
                    row = {**measure_cell(dialect, setting, duration, Path(tmp)), "code": procs.code_fingerprint()}
                    rows.append(row)
                    sink.write(orjson.dumps(row).decode() + "\n")
                    sink.flush()
                    print(f"{row['setting']:<24} {dialect:<10} calls={row['calls']:<5} {row['throughput']:7.1f}/s "
                          f"p50={row['p50_ms']:7.2f} p99={row['p99_ms']:7.2f} ms "
                          f"cpu={row['recorder_cpu_ms_per_call'] or 0:5.2f} ms/call err={row['n_errors']}",
                          file=sys.stderr, flush=True)
    print("| setting | dialect | calls/s | p50 ms | p99 ms | recorder CPU ms/call |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['dialect']} | {r['throughput']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['recorder_cpu_ms_per_call'] or 0:.2f} |")
    return 1 if any(r["n_errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
