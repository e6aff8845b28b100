"""One recorder or two in front of the same engine: aggregate throughput and p99 at 64 sessions.

Why: one recorder is one event loop, so a trainer with more sandboxes than a recorder core can
serve runs several (``docs/scale-out.md``). This measures what a second recorder process buys on
this machine, and the numbers the sizing model is built from: recorder CPU per call (so calls/s per
recorder core) and stored bytes per call.

Setup, the same for both arms: the benchmark's lean engine (``lean_engine.py``, one process; with
``--replicas N``, N of them behind the real vllm-router with ``consistent_hash``), two load
generator processes of ``sessions/2`` agents each (``loadgen.py``, Pi-shaped tool-calling
conversations, no think time), and either one recorder taking both generators or two recorders
taking one each. Arms alternate per round. Every process is started and stopped by its PID.

Honesty about the machine: all of it -- engine, recorders, their index processes, the load
generators -- shares the same cores (2 here); a second recorder can only use what the others leave.

    python benchmarks/bench_scale_out.py --rounds 2 --duration 10 --docs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import procs  # noqa: E402
from loadgen import percentile  # noqa: E402
from measure import store_bytes  # noqa: E402

ADMIN = "bench-admin-token-0123456789abcdef"
RESULTS = BENCH / "results" / "scale_out.json"
DOCS = procs.ROOT / "docs" / "benchmarks.md"
SECTION = "## Scale-out: one recorder or two"
SIM_SECTION = "### Sizing check: many sandboxes with think time"


def _loadgen(url: str, sessions: int, args: argparse.Namespace) -> list[str]:
    return [procs.PYTHON, str(BENCH / "loadgen.py"), "--url", url, "--target", "recorder", "--admin-token", ADMIN,
            "--sessions", str(sessions), "--turns", str(args.turns), "--duration", str(args.duration),
            "--prompt-tokens", str(args.prompt_tokens), "--stream", "--keep-calls", "--timeout", "300",
            "--think-s", str(args.think_s)]


def run_arm(engine_url: str, recorders: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Two load generators against ``recorders`` fresh recorder processes; merged numbers."""
    stores = [work / f"r{recorders}-{i}-{time.time_ns()}.db" for i in range(recorders)]
    servers = [procs.recorder_proc(engine_url, store, ADMIN, work).start() for store in stores]
    try:
        cpu0 = [procs.tree_cpu_seconds(s.pid) for s in servers]
        half = args.sessions // 2
        # each generator writes to a file of its own: a pipe nobody reads yet would cut its output
        files = [(work / f"lg-{recorders}-{i}-{time.time_ns()}.out", work / f"lg-{recorders}-{i}.err") for i in range(2)]
        gens = []
        for i, (out_path, err_path) in enumerate(files):
            with out_path.open("wb") as out, err_path.open("wb") as err:
                gens.append(subprocess.Popen(_loadgen(servers[i % recorders].url, half, args), cwd=procs.ROOT,
                                             stdout=out, stderr=err))
        outs = []
        for gen, (out_path, err_path) in zip(gens, files):
            gen.wait(timeout=args.duration * 20 + 600)
            if gen.returncode != 0:
                raise RuntimeError(f"loadgen failed: {err_path.read_text()[-2000:]}")
            outs.append(json.loads(out_path.read_text().strip().splitlines()[-1]))
        cpu = sum(procs.tree_cpu_seconds(s.pid) - c for s, c in zip(servers, cpu0))
        rss = sum(procs.tree_rss_bytes(s.pid) for s in servers)
    finally:
        for server in servers:
            server.stop()
    sizes = [store_bytes(store) for store in stores]
    latencies = sorted(row[1] for out in outs for row in out["per_call"])
    calls = len(latencies)
    window = max(out["window_s"] for out in outs)
    records = sum(s["records"] for s in sizes)
    return {
        "recorders": recorders, "sessions": args.sessions, "think_s": args.think_s, "calls": calls,
        "errors": sum(out["errors"] for out in outs),
        "error_samples": [e for out in outs for e in out["error_samples"]][:4],
        "throughput": calls / window if window else 0.0, "window_s": window,
        "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
        "recorder_cpu_ms_per_call": cpu * 1000.0 / calls if calls else None,
        "recorder_cores_used": cpu / window if window else None,
        "recorder_rss_mb": rss / 2**20,
        "stored_bytes_per_call": sum(s["logical_bytes"] for s in sizes) / records if records else None,
        "file_bytes_per_call": sum(s["file_bytes"] for s in sizes) / records if records else None,
        "mean_prompt_tokens": sum(out["mean_prompt_tokens"] * out["calls"] for out in outs) / calls if calls else 0,
    }


def _engines(args: argparse.Namespace, work: Path) -> tuple[list[Any], Any]:
    count = max(1, args.replicas)
    engines = [procs.engine_proc("chain", args.prompt_tokens, work).start() for _ in range(count)]
    if args.replicas < 1:
        return engines, None
    from openenv_harness.engine.router import VLLMRouter  # noqa: PLC0415 -- only with --replicas

    router = VLLMRouter([e.url for e in engines], log_path=work / "router.log",
                        extra_args=["--log-level", "warning"]).start()
    return engines, router


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, command: str, load: tuple[float, float]) -> str:
    engine = (f"{args.replicas} lean engines behind vllm-router (consistent_hash)" if args.replicas
              else "one lean engine")
    lines = [SIM_SECTION if args.think_s else SECTION, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M')} machine time, {os.cpu_count()} cores shared by everything "
             f"(engine, recorders and their index processes, two load generators). {args.sessions} sessions "
             f"(2 load generators × {args.sessions // 2}), "
             + (f"{args.think_s:g} s mean think time between an agent's calls (offered load: "
                f"{args.sessions * args.turns / (max(1, args.turns - 1) * args.think_s):.0f} calls/s once all run)"
                if args.think_s else "no think time")
             + ", Pi-shaped streamed tool calls, "
             f"first prompt {args.prompt_tokens} ids growing by a ~2 KB tool result per turn, {args.turns} turns per "
             f"conversation, {args.duration:g} s per arm and round, {engine}. 1-minute load average {load[0]:.1f} before "
             f"and {load[1]:.1f} after (other work on the machine). Command: `{command}`.", "",
             "| recorders | round | calls/s | p50 ms | p99 ms | recorder CPU ms/call | recorder cores | recorder RSS MB "
             "| stored B/call | file B/call | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['recorders']} | {row['round']} | {row['throughput']:.0f} | {row['p50_ms']:.1f} | "
                     f"{row['p99_ms']:.1f} | {row['recorder_cpu_ms_per_call']:.2f} | {row['recorder_cores_used']:.2f} | "
                     f"{row['recorder_rss_mb']:.0f} | "
                     f"{row['stored_bytes_per_call']:.0f} | {row['file_bytes_per_call']:.0f} | {row['errors']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--arms", default="1,2", help="recorder counts to compare, e.g. 1,2 or 1")
    p.add_argument("--think-s", type=float, default=0.0, help="mean pause between an agent's calls")
    p.add_argument("--replicas", type=int, default=0, help="0: one engine directly; N: N engines behind vllm-router")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the JSON rows go")
    p.add_argument("--docs", action="store_true", help=f"append the table to {DOCS.relative_to(procs.ROOT)}")
    args = p.parse_args(argv)
    command = "python benchmarks/bench_scale_out.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows: list[dict[str, Any]] = []
    load_before = procs.loadavg()
    with tempfile.TemporaryDirectory(prefix="oeh-scale-") as tmp:
        work = Path(tmp)
        engines, router = _engines(args, work)
        try:
            url = router.url if router is not None else engines[0].url
            arms = [int(a) for a in args.arms.split(",")]
            for n in range(args.rounds):
                for recorders in (arms if n % 2 == 0 else arms[::-1]):
                    row = {**run_arm(url, recorders, args, work), "round": n + 1}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            if router is not None:
                router.stop()
            for engine in engines:
                engine.stop()
    load = (load_before, procs.loadavg())
    args.results.write_text(json.dumps({"command": command, "load_average": load, "rows": rows}, indent=2) + "\n")
    table = markdown(sorted(rows, key=lambda r: (r["recorders"], r["round"])), args, command, load)
    print(table)
    if args.docs:
        with DOCS.open("a") as f:
            f.write("\n" + table)


if __name__ == "__main__":
    main()
