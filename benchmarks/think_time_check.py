"""Many agents with think time against one recorder, beside the same load sent straight to the engine,
with what the kernel and the scheduler saw: the check behind the think-time notes in ``docs/benchmarks.md``.

Why: at 1,000-2,000 live sessions pausing 10-20 s between calls, the recorder's p99 reached seconds
and reused keep-alive connections were reset while its average CPU was low. Latency alone cannot
say why, so each run also reports, per target:

* the load generator's new and reused connections (a server closing idle connections makes its
  clients reconnect);
* TCP counters: resets sent, ``TCPAbortOnClose`` (a socket closed with an unread request in it: a
  server closing an idle connection just as a request arrived), ``TCPAbortOnData``, listen queue
  overflows and drops, SYN retransmits;
* each process's CPU time and its run-queue wait (``/proc/<pid>/task/*/schedstat``): time it was
  ready to run and waited for a core.

TCP counters are per network namespace; run it in a private one so that only its own traffic counts:

    unshare -n sh -c 'ip link set lo up; python benchmarks/think_time_check.py --sessions 1000 --think-s 10'

Every process is started and stopped by its PID (``procs.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402

ADMIN = "bench-admin-token-0123456789abcdef"
COUNTERS = ("Tcp:OutRsts", "Tcp:ActiveOpens", "TcpExt:TCPAbortOnClose", "TcpExt:TCPAbortOnData",
            "TcpExt:ListenOverflows", "TcpExt:ListenDrops", "TcpExt:TCPSynRetrans")


def tcp_counters() -> dict[str, int]:
    out: dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = Path(path).read_text().splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            head, *fields = names.split()
            out.update({head + name: int(v) for name, v in zip(fields, values.split()[1:])})
    return out


def sched(pids: list[int]) -> tuple[float, float]:
    """CPU seconds and run-queue wait seconds of every thread of ``pids``."""
    cpu = wait = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except FileNotFoundError:
                continue
            cpu, wait = cpu + int(fields[0]), wait + int(fields[1])
    return cpu / 1e9, wait / 1e9


def run(target: str, url: str, watch: dict[str, list[int]], args: argparse.Namespace) -> dict[str, Any]:
    argv = [procs.PYTHON, str(BENCH / "loadgen.py"), "--url", url, "--target", target, "--admin-token", ADMIN,
            "--sessions", str(args.sessions), "--turns", str(args.turns), "--think-s", str(args.think_s),
            "--duration", str(args.duration), "--stream", "--timeout", "300", "--connections", args.connections]
    net0, load0, s0 = tcp_counters(), procs.loadavg(), {k: sched(v) for k, v in watch.items()}
    out = procs.run_json(argv, 3600)
    net1, s1 = tcp_counters(), {k: sched(v) for k, v in watch.items()}
    keep = ("calls", "errors", "error_samples", "throughput", "p50_ms", "p99_ms", "max_ms", "new_connections",
            "reused_connections")
    return {"target": target, **{k: out[k] for k in keep},
            "tcp": {k.split(":")[1]: net1.get(k, 0) - net0.get(k, 0) for k in COUNTERS},
            "sched": {k: {"cpu_s": round(s1[k][0] - s0[k][0], 2), "runqueue_wait_s": round(s1[k][1] - s0[k][1], 2)}
                      for k in watch},
            "load_average": [load0, procs.loadavg()]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=300)
    p.add_argument("--think-s", type=float, default=6.0)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--connections", choices=("shared", "per-agent"), default="per-agent")
    p.add_argument("--targets", default="direct,recorder")
    p.add_argument("--recorder-arg", action="append", default=[], help="extra recorder flag, e.g. --keep-alive-s=5")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="oeh-think-") as tmp:
        work = Path(tmp)
        engine = procs.engine_proc("chain", 1024, work).start()
        recorder = procs.recorder_proc(engine.url, work / "store.db", ADMIN, work)
        recorder.argv += args.recorder_arg
        recorder.start()
        try:
            for target in args.targets.split(","):
                watch = {"engine": [engine.pid]}
                if target == "recorder":
                    watch["recorder"] = [recorder.pid, *procs.descendants(recorder.pid)]
                url = recorder.url if target == "recorder" else engine.url
                print(json.dumps({**run(target, url, watch, args), "recorder_args": args.recorder_arg}), flush=True)
        finally:
            recorder.stop()
            engine.stop()


if __name__ == "__main__":
    main()
