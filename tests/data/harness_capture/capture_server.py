"""The scripted capture server the Codex and Claude Code request captures were made with.

A test double standing in for a model provider: it answers the Responses API (Codex) and the
Anthropic Messages API (Claude Code) well enough to drive one short tool episode, and writes every
request it receives (method, path, query, headers with secrets shortened, full JSON body) to
``--logdir/NNN-METHOD-path.json``. Standard library only, so it runs anywhere the CLIs do.

Script: a request that offers tools and carries no tool result after its last user turn gets one
shell tool call (``Bash`` for Claude Code; Codex's ``exec_command``/``shell_command``/``shell``,
whichever it offers) with deliberately spaced JSON arguments; anything else gets text
("FINAL ANSWER ..." on tool episodes, "Stub Title" when no tools were offered). ``--reasoning``
adds a reasoning/thinking part to every reply, to see how each CLI sends it back.

    python3 capture_server.py --port 18090 --logdir DIR [--reasoning] [--command 'echo hi']
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SECRET_HEADERS = {"authorization", "x-api-key", "api-key"}
_counter = itertools.count(1)
_lock = threading.Lock()


def _redact(name: str, value: str) -> str:
    if name.lower() in _SECRET_HEADERS:
        return f"<redacted len={len(value)} prefix={value[:10]!r}>"
    return value


def _sse(event: str | None, payload: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(payload) + "\n\n").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "capture/1"
    options: argparse.Namespace

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        pass

    def _log(self, body: Any) -> None:
        seq = next(_counter)
        path, _, query = self.path.partition("?")
        name = f"{seq:03d}-{self.command}-{path.strip('/').replace('/', '_')}.json"
        entry = {"seq": seq, "t": time.time(), "method": self.command, "path": path, "query": query,
                 "headers": {k: _redact(k, v) for k, v in self.headers.items()}, "body": body}
        with _lock, open(os.path.join(self.options.logdir, name), "w") as handle:
            json.dump(entry, handle, indent=1)

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, frames: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for frame in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:  # noqa: N802
        self._log(None)
        path = self.path.split("?")[0]
        if path.endswith("/models"):
            if "anthropic-version" in {k.lower() for k in self.headers}:
                self._json(200, {"data": [{"type": "model", "id": self.options.model, "display_name": "stub",
                                            "created_at": "2026-01-01T00:00:00Z"}], "has_more": False})
            else:
                self._json(200, {"object": "list", "data": [{"id": self.options.model, "object": "model",
                                                              "owned_by": "stub"}]})
            return
        self._json(404, {"error": {"message": f"no route GET {path}", "type": "not_found"}})

    def do_HEAD(self) -> None:  # noqa: N802
        self._log(None)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = {"_undecodable_bytes": len(raw), "_content_encoding": self.headers.get("content-encoding")}
        self._log(body)
        path = self.path.split("?")[0]
        if path.endswith("/messages/count_tokens"):
            self._json(200, {"input_tokens": 42})
        elif path.endswith("/messages"):
            self._anthropic(body or {})
        elif path.endswith("/responses"):
            self._responses(body or {})
        else:
            self._json(404, {"error": {"message": f"no route POST {path}", "type": "not_found"}})

    # -- the script ------------------------------------------------------------------------------

    def _args(self, tool: str) -> str:
        command = self.options.command
        if tool == "shell":
            return '{"command" : ["bash", "-lc", ' + json.dumps(command) + "],\n \"timeout_ms\": 5000}"
        if tool == "exec_command":
            return '{"cmd" :  ' + json.dumps(command) + ",\n \"yield_time_ms\": 5000}"
        return '{"command" :  ' + json.dumps(command) + ',\n "description": "Print a greeting"}'

    def _anthropic(self, body: dict[str, Any]) -> None:
        tools = [t.get("name") for t in body.get("tools") or []]
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        content = last.get("content")
        has_result = isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        blocks: list[dict[str, Any]] = []
        if self.options.reasoning:
            blocks.append({"type": "thinking", "thinking": "Thinking about echo.", "signature": "stub-signature-1"})
        if "Bash" in tools and not has_result:
            blocks.append({"type": "tool_use", "id": f"toolu_stub{next(_counter):03d}", "name": "Bash",
                           "input": json.loads(self._args("Bash")), "_raw": self._args("Bash")})
            stop = "tool_use"
        else:
            blocks.append({"type": "text", "text": "FINAL ANSWER: hi" if tools else "Stub Title"})
            stop = "end_turn"
        if body.get("max_tokens") == 1:
            blocks = [{"type": "text", "text": "x"}]
            stop = "max_tokens"
        message = {"id": f"msg_stub{next(_counter):03d}", "type": "message", "role": "assistant",
                   "model": body.get("model", "stub"), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 100, "output_tokens": 1, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0}}
        if not body.get("stream"):
            out = {**message, "content": [{k: v for k, v in b.items() if k != "_raw"} for b in blocks],
                   "stop_reason": stop, "usage": {**message["usage"], "output_tokens": 10}}
            self._json(200, out)
            return
        frames = [_sse("message_start", {"type": "message_start", "message": message})]
        for i, block in enumerate(blocks):
            kind = block["type"]
            if kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                          {"type": "signature_delta", "signature": block["signature"]}]
            elif kind == "text":
                start = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"]}]
            else:
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                raw = block["_raw"]
                third = max(1, len(raw) // 3)
                deltas = [{"type": "input_json_delta", "partial_json": raw[j : j + third]}
                          for j in range(0, len(raw), third)]
            frames.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": start}))
            frames += [_sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
                       for d in deltas]
            frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        frames.append(_sse("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": stop, "stop_sequence": None},
                                             "usage": {"output_tokens": 10}}))
        frames.append(_sse("message_stop", {"type": "message_stop"}))
        self._stream(frames)

    def _responses(self, body: dict[str, Any]) -> None:
        offered = []
        for tool in body.get("tools") or []:
            offered.append(tool.get("name") or tool.get("type"))
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        last_user = max((i for i, it in enumerate(items) if it.get("role") == "user"), default=-1)
        has_output = any(str(it.get("type", "")).endswith("_output") for it in items[last_user + 1 :])
        shell = next((t for t in ("exec_command", "shell_command", "shell") if t in offered), None)
        rid = f"resp_stub{next(_counter):03d}"
        output: list[dict[str, Any]] = []
        if self.options.reasoning:
            output.append({"id": f"rs_stub{next(_counter):03d}", "type": "reasoning",
                           "summary": [{"type": "summary_text", "text": "Thinking about echo."}],
                           "content": [{"type": "reasoning_text", "text": "Thinking about echo."}]})
        if shell and not has_output:
            args = self._args(shell)
            output.append({"id": f"fc_stub{next(_counter):03d}", "type": "function_call", "status": "completed",
                           "call_id": f"call_stub{next(_counter):03d}", "name": shell, "arguments": args})
        else:
            text = "FINAL ANSWER: hi" if offered else "Stub Title"
            output.append({"id": f"msg_stub{next(_counter):03d}", "type": "message", "status": "completed",
                           "role": "assistant", "content": [{"type": "output_text", "text": text,
                                                             "annotations": []}]})
        usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
        response = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
                    "model": body.get("model", "stub"), "output": [], "usage": None}
        done = {**response, "status": "completed", "output": output, "usage": usage}
        if not body.get("stream"):
            self._json(200, done)
            return
        seq = itertools.count()
        frames = [_sse("response.created", {"type": "response.created", "sequence_number": next(seq),
                                            "response": response}),
                  _sse("response.in_progress", {"type": "response.in_progress", "sequence_number": next(seq),
                                                "response": response})]
        for index, item in enumerate(output):
            kind = item["type"]
            empty = dict(item, status="in_progress")
            if kind == "message":
                empty["content"] = []
            elif kind == "function_call":
                empty["arguments"] = ""
            elif kind == "reasoning":
                empty["summary"], empty["content"] = [], []
            frames.append(_sse("response.output_item.added", {"type": "response.output_item.added",
                                                              "sequence_number": next(seq), "output_index": index,
                                                              "item": empty}))
            common = {"item_id": item["id"], "output_index": index}
            if kind == "message":
                text = item["content"][0]["text"]
                part = {"type": "output_text", "text": "", "annotations": []}
                frames.append(_sse("response.content_part.added", {"type": "response.content_part.added",
                                   "sequence_number": next(seq), "content_index": 0, "part": part, **common}))
                frames.append(_sse("response.output_text.delta", {"type": "response.output_text.delta",
                                   "sequence_number": next(seq), "content_index": 0, "delta": text, **common}))
                frames.append(_sse("response.output_text.done", {"type": "response.output_text.done",
                                   "sequence_number": next(seq), "content_index": 0, "text": text, **common}))
                frames.append(_sse("response.content_part.done", {"type": "response.content_part.done",
                                   "sequence_number": next(seq), "content_index": 0,
                                   "part": item["content"][0], **common}))
            elif kind == "function_call":
                args = item["arguments"]
                third = max(1, len(args) // 3)
                for j in range(0, len(args), third):
                    frames.append(_sse("response.function_call_arguments.delta", {
                        "type": "response.function_call_arguments.delta", "sequence_number": next(seq),
                        "delta": args[j : j + third], **common}))
                frames.append(_sse("response.function_call_arguments.done", {
                    "type": "response.function_call_arguments.done", "sequence_number": next(seq),
                    "arguments": args, **common}))
            elif kind == "reasoning":
                text = item["content"][0]["text"]
                frames.append(_sse("response.reasoning_text.delta", {"type": "response.reasoning_text.delta",
                                   "sequence_number": next(seq), "content_index": 0, "delta": text, **common}))
                frames.append(_sse("response.reasoning_text.done", {"type": "response.reasoning_text.done",
                                   "sequence_number": next(seq), "content_index": 0, "text": text, **common}))
            frames.append(_sse("response.output_item.done", {"type": "response.output_item.done",
                                                             "sequence_number": next(seq), "output_index": index,
                                                             "item": item}))
        frames.append(_sse("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                                  "response": done}))
        self._stream(frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18090)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--model", default="policy-model")
    parser.add_argument("--command", default="echo hi")
    parser.add_argument("--reasoning", action="store_true")
    options = parser.parse_args()
    os.makedirs(options.logdir, exist_ok=True)
    Handler.options = options
    server = ThreadingHTTPServer(("127.0.0.1", options.port), Handler)
    server.daemon_threads = True
    print(f"capture server on 127.0.0.1:{options.port}, logging to {options.logdir}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
