"""Added latency and throughput per prompt mode on the reference engine (docs/benchmarks.md).

Each rollout is a 12-turn tool-calling agent loop (pi-style echo, spaced tool arguments: the drift
incremental mode removes) against a recorder in front of the reference engine; the same loop
straight at the engine is "direct". Engine, recorder and this load generator are separate processes
on loopback (one interpreter would make every extra engine round trip contend for one GIL).

- Latency: one session at a time, rounds alternate the order of the modes (A/B/C, then B/C/A, ...)
  so drifting machine load spreads over all of them; per-call p50/p90 in ms.
- Throughput: N concurrent sessions (each runs rollouts back to back, a new session per rollout)
  for a fixed time per mode, modes alternated the same way; chat calls completed per second.

    PYTHONPATH=$PWD python benchmarks/bench_prompt_mode.py [--rounds 8] [--concurrency 16 64] [--duration 8]
        [--baseline-tree DIR]   # also DIR's engine and recorder (e.g. a git worktree of an earlier
                                # commit), measured as MODE@base and alternated with the rest
        [--engine-arg=--generate-derender] [--baseline-engine-arg=...]   # the engines' own flags
        [--tools small|opencode|pi]   # the tool list each call offers (a real agent's: captured)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "recorder"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentloop import ADMIN, TOOLS, tool_script  # noqa: E402
from procs import PYTHON, Proc, free_port, loadavg, recorder_proc, tree_cpu_seconds  # noqa: E402

from openenv_harness.testing.engine import agent_echo  # noqa: E402

TURNS = 12
MODES = ("direct", "full_history", "incremental")


def engine_proc(logs: Path, cwd: Path | None = None, extra: list[str] | None = None) -> Proc:
    """The reference engine; from ``cwd``'s code when given (``python -m`` puts the cwd first)."""
    port = free_port()
    argv = [PYTHON, "-m", "openenv_harness.testing.engine", "--port", str(port), *(extra or [])]
    proc = Proc("engine", argv, port, "/health", logs / f"engine-{port}.log")
    if cwd is not None:
        proc.cwd = cwd
    return proc


async def _rollout(http: httpx.AsyncClient, url: str, headers: dict[str, str], times: list[float],
                   tools: list[dict[str, Any]] = TOOLS) -> int:
    """One agent loop; appends each call's latency in ms; returns the calls made."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."},
                                      {"role": "user", "content": "Do the task step by step."}]
    for n in range(1, TURNS + 2):
        started = time.perf_counter()
        r = await http.post(f"{url}/chat/completions", headers=headers,
                            json={"model": "reference-model", "messages": messages, "tools": tools, "max_tokens": 512})
        times.append((time.perf_counter() - started) * 1000.0)
        r.raise_for_status()
        message = r.json()["choices"][0]["message"]
        if not message.get("tool_calls"):
            return n
        messages = messages + [agent_echo(message, "pi")]
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ran\n"})
    return TURNS + 1


async def _target(http: httpx.AsyncClient, mode: str, engine: str, recorder: str | dict[str, str]
                  ) -> tuple[str, dict[str, str]]:
    """Where a rollout of ``mode`` goes: the engine, or a new session; ``mode@base`` names the
    baseline recorder (``--baseline-tree``)."""
    if mode == "direct":
        return f"{engine}/v1", {}
    mode, _, which = mode.partition("@")
    if isinstance(recorder, dict):
        recorder = recorder[which]
    r = await http.post(f"{recorder}/admin/sessions", json={"prompt_mode": mode},
                        headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    s = r.json()
    return s["base_url"], {"authorization": f"Bearer {s['secret']}"}


async def _latency(engines: dict[str, Proc], recorders: dict[str, Proc], rounds: int, modes: tuple[str, ...],
                   per_round: dict[str, list[float]] | None = None, tools: list[dict[str, Any]] = TOOLS
                   ) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Per-call latencies per mode, and the CPU seconds the engine and the recorder (with its index
    process) spent on each mode's calls (one call at a time, so the attribution is clean);
    ``per_round`` gets each round's median per mode (a round runs every mode once, back to back)."""
    results: dict[str, list[float]] = {m: [] for m in modes}
    cpu = {m: {"engine": 0.0, "recorder": 0.0} for m in modes}
    urls = {k: p.url for k, p in recorders.items()}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(keepalive_expiry=2.0)) as http:
        for i in range(rounds + 1):  # round 0 warms up
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                times: list[float] = []
                which = mode.partition("@")[2]
                engine, recorder = engines[which], recorders[which]
                url, headers = await _target(http, mode, engine.url, urls)
                before = tree_cpu_seconds(engine.pid), tree_cpu_seconds(recorder.pid)
                await _rollout(http, url, headers, times, tools)
                if i:
                    results[mode].extend(times)
                    if per_round is not None:
                        per_round.setdefault(mode, []).append(statistics.median(times))
                    cpu[mode]["engine"] += tree_cpu_seconds(engine.pid) - before[0]
                    cpu[mode]["recorder"] += tree_cpu_seconds(recorder.pid) - before[1]
    return results, cpu


async def _throughput(engine: str, recorder: dict[str, str], mode: str, sessions: int, duration_s: float,
                      tools: list[dict[str, Any]] = TOOLS) -> tuple[float, int]:
    # idle connections expire before the servers' keep-alive timeout (uvicorn's 5 s): no reuse races
    limits = httpx.Limits(max_connections=sessions + 4, max_keepalive_connections=sessions + 4, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        deadline = time.perf_counter() + duration_s
        counted, failed = [0], [0]

        async def worker() -> None:
            while time.perf_counter() < deadline:
                times: list[float] = []
                try:
                    url, headers = await _target(http, mode, engine, recorder)
                    await _rollout(http, url, headers, times, tools)
                except (httpx.TransportError, httpx.HTTPStatusError):
                    failed[0] += 1  # reported; the rollout's completed calls still count
                counted[0] += len(times)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(sessions)))
        return counted[0] / (time.perf_counter() - started), failed[0]


def _quantiles(times: list[float]) -> tuple[float, float]:
    return statistics.median(times), statistics.quantiles(times, n=10)[8]


async def _script(engine: str) -> None:
    body = {"key": "*", "script": tool_script(TURNS, spaced_args=True).model_dump(mode="json")}
    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(f"{engine}/_ref/scripts", json=body)).raise_for_status()


CAPTURED_AGENTS = ("opencode", "pi")


def captured_tools(agent: str) -> list[dict[str, Any]]:
    """The tool list a real agent sent (its first tool-calling request, captured in tests/data)."""
    folder = Path(__file__).resolve().parents[1] / "tests" / "data" / "harness_capture" / agent / "basic" / "requests"
    for path in sorted(folder.glob("*chat_completions.json")):
        body = json.loads(path.read_text()).get("body") or {}
        if isinstance(body, dict) and body.get("tools"):
            return body["tools"]
    raise SystemExit(f"no captured {agent} request with tools under {folder}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6, help="latency rounds (each: one rollout per mode)")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per mode and concurrency")
    parser.add_argument("--throughput-rounds", type=int, default=2)
    parser.add_argument("--baseline-tree", type=Path, help="a checkout of other code: its engine and recorder run "
                        "beside these and its modes are measured as MODE@base, alternated with the rest")
    parser.add_argument("--engine-arg", action="append", default=[], help="an argument for this tree's engine "
                        "(repeatable), e.g. --engine-arg=--generate-derender (vLLM 0.33's one-step parse)")
    parser.add_argument("--baseline-engine-arg", action="append", default=[], help="the same for DIR's engine")
    parser.add_argument("--tools", default="small", choices=("small", *CAPTURED_AGENTS),
                        help="the tool list every call offers: two small tools, or a real agent's (captured)")
    args = parser.parse_args()
    tools = TOOLS if args.tools == "small" else captured_tools(args.tools)
    modes = MODES + (("full_history@base", "incremental@base") if args.baseline_tree else ())
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        load_before = loadavg()
        with contextlib.ExitStack() as stack:
            engine = stack.enter_context(engine_proc(logs, extra=args.engine_arg))
            engines = {"": engine}
            recorders = {"": stack.enter_context(recorder_proc(engine.url, logs / "r.db", ADMIN, logs))}
            if args.baseline_tree:
                tree = args.baseline_tree.resolve()
                engines["base"] = stack.enter_context(engine_proc(logs, cwd=tree, extra=args.baseline_engine_arg))
                base = recorder_proc(engines["base"].url, logs / "base.db", ADMIN, logs)
                base.cwd = tree
                recorders["base"] = stack.enter_context(base)
            urls = {k: p.url for k, p in recorders.items()}
            for e in engines.values():
                asyncio.run(_script(e.url))
            rounds: dict[str, list[float]] = {}
            latency, cpu = asyncio.run(_latency(engines, recorders, args.rounds, modes, rounds, tools))
            throughput: dict[tuple[str, int], list[float]] = {}
            failures: dict[tuple[str, int], int] = {}
            for n in args.concurrency:
                for i in range(args.throughput_rounds):
                    for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                        rate, failed = asyncio.run(_throughput(engine.url, urls, mode, n, args.duration, tools))
                        throughput.setdefault((mode, n), []).append(rate)
                        failures[(mode, n)] = failures.get((mode, n), 0) + failed
        load_after = loadavg()
    print(f"load average (1 min): {load_before:.1f} before, {load_after:.1f} after; tools: {args.tools} "
          f"({len(tools)}, {len(json.dumps(tools))} bytes of JSON)")
    for mode, times in latency.items():
        p50, p90 = _quantiles(times)
        per_call = {k: v * 1000.0 / len(times) for k, v in cpu[mode].items()}
        print(f"latency  {mode:13s} calls={len(times):4d} p50={p50:6.2f} ms  p90={p90:6.2f} ms  "
              f"cpu/call: engine {per_call['engine']:5.2f} ms, recorder {per_call['recorder']:5.2f} ms")
    base = statistics.median(latency["full_history"])
    print(f"latency  incremental - full_history p50: {statistics.median(latency['incremental']) - base:+.2f} ms")
    print(f"latency  full_history - direct p50: {base - statistics.median(latency['direct']):+.2f} ms")
    # paired within rounds: the machine's speed drifts between rounds far more than within one
    paired = [i - f for i, f in zip(rounds["incremental"], rounds["full_history"])]
    print(f"latency  incremental - full_history, median of the rounds' differences of medians: "
          f"{statistics.median(paired):+.2f} ms (rounds: {len(paired)}; quartiles "
          f"{' / '.join(f'{q:+.2f}' for q in statistics.quantiles(paired, n=4))})")
    if args.baseline_tree:
        old = statistics.median(latency["incremental@base"]) - statistics.median(latency["full_history@base"])
        print(f"latency  baseline incremental - full_history p50: {old:+.2f} ms")
        paired = [i - f for i, f in zip(rounds["incremental@base"], rounds["full_history@base"])]
        print(f"latency  baseline incremental - full_history, median of the rounds' differences: "
              f"{statistics.median(paired):+.2f} ms")
    for (mode, n), rates in throughput.items():
        print(f"throughput {mode:13s} sessions={n:3d} calls/s={statistics.mean(rates):7.1f}  "
              f"(rounds: {', '.join(f'{r:.1f}' for r in rates)}; failed rollouts: {failures[(mode, n)]})")


if __name__ == "__main__":
    main()
