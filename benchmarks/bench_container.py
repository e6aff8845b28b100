"""What a container sandbox costs next to the local one: start-up, a command, and a model call.

Measured in one run, each against the local sandbox on the same machine:

* ``start``   -- a sandbox ready for an agent: created, and (container) its relay up and linked;
  then ``close()``;
* ``command`` -- ``sandbox.run("true")``: what each verifier or setup command pays;
* ``call``    -- one HTTP POST (2 KiB body, 1 KiB reply) from inside the sandbox to a target on the
  host's loopback standing in for the recorder: direct for the local sandbox, through the relay's
  Unix-socket link for the container. Sequential calls, from a Python client running in the sandbox.

Run: ``python benchmarks/bench_container.py [--starts 8] [--commands 40] [--calls 300] [--json out.json]``.
Needs a container engine and the default image (``./dev setup``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openenv_harness.sandbox.base import Sandbox
from openenv_harness.sandbox.container import ContainerSandbox
from openenv_harness.sandbox.local import LocalSandbox

REPLY = b"y" * 1024

CLIENT = r"""
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
body = b"x" * 2048
times = []
for _ in range(n):
    t = time.perf_counter()
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req) as reply:
        reply.read()
    times.append((time.perf_counter() - t) * 1000)
print(json.dumps(times))
"""


class _Target(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        # head and body in one write: two small writes on a kept-alive connection meet Nagle and the
        # peer's delayed ACK (~40 ms), which would be this target's cost, not the path's
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(REPLY), REPLY))

    def log_message(self, *_args: Any) -> None:
        pass


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 2),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2), "mean": round(statistics.fmean(ordered), 2)}


def measure(name: str, make: Callable[[], Sandbox], target: str, starts: int, commands: int, calls: int) -> dict[str, Any]:
    start_ms = []
    for _ in range(starts):
        t = time.perf_counter()
        box = make()
        box.start_sandbox()
        box.model_endpoint(f"{target}/rollout/x/v1", "k")
        start_ms.append((time.perf_counter() - t) * 1000)
        box.close()
    with make() as box:
        endpoint = box.model_endpoint(f"{target}/rollout/x/v1", "k")
        command_ms = []
        for _ in range(commands):
            t = time.perf_counter()
            result = box.run("true")
            command_ms.append((time.perf_counter() - t) * 1000)
            assert result.exit_code == 0, result
        box.write_file("client.py", CLIENT)
        done = box.run(["python3", "client.py", f"{endpoint.base_url}/chat/completions", str(calls)], timeout_s=600)
        assert done.exit_code == 0, done.stderr
        call_ms = json.loads(done.stdout)
    return {"sandbox": name, "start_ms": summary(start_ms), "command_ms": summary(command_ms),
            "call_ms": summary(call_ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument("--commands", type=int, default=40)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{server.server_address[1]}"
    rows = [measure("local", LocalSandbox, target, args.starts, args.commands, args.calls),
            measure("docker", ContainerSandbox, target, args.starts, args.commands, args.calls)]
    server.shutdown()
    print(f"{'sandbox':8} {'start p50/p90 ms':>18} {'command p50/p90 ms':>20} {'call p50/p90 ms':>18}")
    for row in rows:
        s, c, k = row["start_ms"], row["command_ms"], row["call_ms"]
        print(f"{row['sandbox']:8} {s['p50']:>9}/{s['p90']:<8} {c['p50']:>10}/{c['p90']:<9} {k['p50']:>9}/{k['p90']:<8}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
