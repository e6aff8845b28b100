"""A null admin server: answers session create and close with constant replies, doing no work at all.

Why: ``bench_admin_floor.py`` puts it where the recorder's admin listener would be -- a thread of the
recorder's own interpreter, or a process of its own -- under the same load, so the latency a trainer
sees from it is the floor any admin server pays there: the machine's scheduling and, in the thread,
the interpreter lock shared with the chat path. Whatever the real listener adds above it is its own.

    python benchmarks/null_admin.py PORT NICE        # as a process of its own, NICE steps from ours
    python -c "import null_admin; null_admin.start_in_thread(PORT, NICE); ..."   # inside an interpreter

It speaks just enough HTTP/1.1 for a keep-alive client: a request head, a ``content-length`` body,
one fixed reply per request (201 and a session id for ``POST /admin/sessions``, 200 for a close).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Callable

_CREATE_BODY = b'{"session_id":"s-null"}'
CREATE = (b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: "
          + str(len(_CREATE_BODY)).encode() + b"\r\n\r\n" + _CREATE_BODY)
CLOSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class NullAdmin(asyncio.Protocol):
    """One connection: each complete request gets its constant reply, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, rest = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            assert self.transport is not None
            self.transport.write(CLOSE if b"/close" in lines[0] else CREATE)


def serve(port: int, on_listening: Callable[[], object] | None = None) -> None:
    """Serve on 127.0.0.1:``port`` on a loop of this thread's own, forever; ``on_listening`` runs once
    the port accepts connections (a client told earlier could be refused)."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.create_server(NullAdmin, "127.0.0.1", port))
    if on_listening is not None:
        on_listening()
    loop.run_forever()


def start_in_thread(port: int, nice: int) -> threading.Thread:
    """A daemon thread serving ``port``, raised ``nice`` steps as the recorder raises its listener."""
    ready = threading.Event()
    thread = threading.Thread(target=serve, args=(port, ready.set), name="null-admin", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the null admin server did not start")
    if nice and thread.native_id is not None:
        os.setpriority(os.PRIO_PROCESS, thread.native_id, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    return thread


if __name__ == "__main__":
    port, nice = int(sys.argv[1]), int(sys.argv[2])
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    serve(port, lambda: print(f"null admin on {port} at nice {os.getpriority(os.PRIO_PROCESS, 0)}", flush=True))
