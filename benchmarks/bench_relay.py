"""What the relay costs: latency and throughput through it versus straight to the target.

Three paths to the same HTTP target (a tiny ASGI app under uvicorn, standing in for the recorder):

* ``direct``  -- client -> target (what a local sandbox gets);
* ``relay``   -- client -> in-sandbox relay process -> WebSocket -> dialer -> target;
* ``relay+proxy`` -- the same through the HF emulator's port proxy (a real byte splice, as the
  sandbox server does), set up with ``HFSandbox`` exactly as a rollout would be.

Run: ``python benchmarks/bench_relay.py [--calls 300] [--size-mib 32] [--concurrency 32]``.
Numbers are loopback numbers: on a real HF sandbox the WAN round trip dominates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from openenv_harness.relay import DialerThread, RelayDialer, sandbox_program_sources

Scope = dict[str, Any]
PIECE = b"x" * 65536


Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


async def target_app(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /echo`` echoes; ``GET /bytes?n=`` streams n bytes; ``GET /sse?n=`` streams n events."""
    if scope["type"] != "http":
        return
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path, query = scope["path"], dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
    if path == "/echo":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": bytes(body)})
        return
    count = int(query.get("n", "0"))
    streaming = path == "/sse"
    content_type = b"text/event-stream" if streaming else b"application/octet-stream"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
    if streaming:
        for index in range(count):
            await send({"type": "http.response.body", "body": b'data: {"token": %d}\n\n' % index, "more_body": True})
    else:
        remaining = count
        while remaining > 0:
            part = PIECE[: min(len(PIECE), remaining)]
            remaining -= len(part)
            await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def start_target() -> tuple[str, uvicorn.Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(target_app, log_level="warning", lifespan="off", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def start_relay(workdir: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    for name, source in sandbox_program_sources().items():
        (workdir / name).write_bytes(source)
    process = subprocess.Popen(
        [sys.executable, "-S", str(workdir / "sandbox_relay.py"), "--http-port", "0", "--ws-port", "0",
         "--log-level", "WARNING"], stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(base: str, args: argparse.Namespace) -> dict[str, float]:
    payload = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for _ in range(20):  # warm up connections and code paths
            await client.post(f"{base}/echo", content=payload)
        latencies = []
        for _ in range(args.calls):
            started = time.perf_counter()
            reply = await client.post(f"{base}/echo", content=payload)
            latencies.append(time.perf_counter() - started)
            assert reply.content == payload
        first_bytes = []
        for _ in range(max(20, args.calls // 10)):
            started = time.perf_counter()
            async with client.stream("GET", f"{base}/sse?n=50") as reply:
                first = True
                async for _chunk in reply.aiter_raw():
                    if first:
                        first_bytes.append(time.perf_counter() - started)
                        first = False
        size = args.size_mib * 1024 * 1024
        started = time.perf_counter()
        received = 0
        async with client.stream("GET", f"{base}/bytes?n={size}") as reply:
            async for chunk in reply.aiter_raw():
                received += len(chunk)
        download = received / (time.perf_counter() - started) / 1e6
        blob = os.urandom(size)
        started = time.perf_counter()
        reply = await client.post(f"{base}/echo", content=blob)
        assert len(reply.content) == size
        round_trip = 2 * size / (time.perf_counter() - started) / 1e6
        started = time.perf_counter()
        rounds = 10
        for _ in range(rounds):
            await asyncio.gather(*(client.post(f"{base}/echo", content=payload) for _ in range(args.concurrency)))
        calls_per_s = rounds * args.concurrency / (time.perf_counter() - started)
    return {
        "p50_ms": statistics.median(latencies) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
        "ttfb_p50_ms": statistics.median(first_bytes) * 1e3, "download_MBps": download,
        "echo_MBps": round_trip, "concurrent_calls_per_s": calls_per_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--skip-proxy", action="store_true", help="skip the HF emulator path")
    args = parser.parse_args()
    target, server = start_target()
    results: dict[str, dict[str, float]] = {"direct": asyncio.run(measure(target, args))}
    with tempfile.TemporaryDirectory() as scratch:
        relay, ready = start_relay(Path(scratch))
        runner = DialerThread(lambda: RelayDialer(lambda: f"ws://127.0.0.1:{ready['ws_port']}/relay", dict, target))
        try:
            runner.start().wait_connected(10)
            results["relay"] = asyncio.run(measure(f"http://127.0.0.1:{ready['http_port']}", args))
        finally:
            runner.stop()
            relay.terminate()
            relay.wait()
        if not args.skip_proxy:
            from openenv_harness.sandbox.hf import HFSandbox  # noqa: PLC0415
            from openenv_harness.testing.hf_emulator import HFEmulator, hub_pointed_at  # noqa: PLC0415

            with HFEmulator() as emulator, hub_pointed_at(emulator, Path(scratch) / "hf-home"):
                with HFSandbox(ws_scheme="ws://") as sandbox:
                    endpoint = sandbox.model_endpoint(target, "bench-key")
                    results["relay+proxy"] = asyncio.run(measure(endpoint.base_url.rstrip("/"), args))
    server.should_exit = True
    columns = list(results["direct"])
    print(f"{'path':<12}" + "".join(f"{c:>24}" for c in columns))
    for name, row in results.items():
        print(f"{name:<12}" + "".join(f"{row[c]:>24.2f}" for c in columns))


if __name__ == "__main__":
    main()
