"""The null admin server answers the admin probe's create and close as the recorder would, over one
keep-alive connection, from a thread and as a process of its own (``bench_admin_floor`` cells)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import orjson

import bench_footprint
import null_admin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe(port: int) -> dict[str, list[float]]:
    """Rounds of create then close for 0.3 s; the probe asserts each answer, and runs at least one."""
    return asyncio.run(bench_footprint._admin_probe(f"http://127.0.0.1:{port}", "token",
                                                    time.perf_counter() + 0.3, 0.01))


def test_a_thread_answers_create_and_close_on_one_connection() -> None:
    port = _free_port()
    null_admin.start_in_thread(port, 0)
    out = _probe(port)  # asserts 201 with a session id, then 200, on every round
    assert len(out["create"]) >= 1 and len(out["create"]) == len(out["close"])


def test_a_request_split_across_reads_gets_one_reply() -> None:
    port = _free_port()
    null_admin.start_in_thread(port, 0)
    body = orjson.dumps({"harness": "probe"})
    head = (f"POST /admin/sessions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + body[:3])
        s.sendall(body[3:] + b"POST /admin/sessions/s-null/close HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1") < 2:
            data += s.recv(4096)
    assert data == null_admin.CREATE + null_admin.CLOSE


def test_as_a_process_it_says_when_it_serves() -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, null_admin.__file__, str(port), "0"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"null admin on")
        out = _probe(port)  # at once: it printed only once listening
        assert len(out["create"]) >= 1 and len(out["create"]) == len(out["close"])
    finally:
        proc.kill()
        proc.wait()
