"""Added latency per prompt mode on the reference engine, one session (docs/benchmarks.md).

Each rollout is a 12-turn tool-calling agent loop (pi-style echo, spaced tool arguments: the drift
incremental mode removes) against a recorder in front of the reference engine on loopback; the
same loop straight at the engine is "direct". Reports per-call p50/p90 in ms for each mode and the
incremental mode's extra engine round trips (render x2-3, generate, derender instead of one chat).

    PYTHONPATH=$PWD python benchmarks/bench_prompt_mode.py [--rollouts 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "recorder"))
from agentloop import ADMIN, TOOLS, tool_script  # noqa: E402

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer  # noqa: E402
from openenv_harness.testing.engine import EngineServer, agent_echo  # noqa: E402

TURNS = 12


def _loop(url: str, headers: dict[str, str], times: list[float]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."},
                                      {"role": "user", "content": "Do the task step by step."}]
    with httpx.Client(timeout=60) as http:
        for _ in range(TURNS + 1):
            started = time.perf_counter()
            r = http.post(f"{url}/chat/completions", headers=headers,
                          json={"model": "reference-model", "messages": messages, "tools": TOOLS, "max_tokens": 512})
            times.append((time.perf_counter() - started) * 1000.0)
            r.raise_for_status()
            message = r.json()["choices"][0]["message"]
            if not message.get("tool_calls"):
                return
            messages = messages + [agent_echo(message, "pi")]
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ran\n"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"direct": [], "full_history": [], "incremental": []}
    with EngineServer() as engine, tempfile.TemporaryDirectory() as tmp:
        engine.set_script("*", tool_script(TURNS, spaced_args=True))
        config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
            for i in range(args.rollouts + 1):  # the first round warms up
                for mode in results:
                    times: list[float] = []
                    if mode == "direct":
                        _loop(engine.openai_base_url, {}, times)
                    else:
                        s = admin.create_session(prompt_mode=mode)
                        engine.set_script(s["session_id"], tool_script(TURNS, spaced_args=True))
                        _loop(s["base_url"], {"authorization": f"Bearer {s['secret']}"}, times)
                    if i:
                        results[mode].extend(times)
    for mode, times in results.items():
        q = statistics.quantiles(times, n=10)
        print(f"{mode:13s} calls={len(times):4d} p50={statistics.median(times):6.2f} ms  p90={q[8]:6.2f} ms")
    base = statistics.median(results["full_history"])
    print(f"incremental - full_history p50: {statistics.median(results['incremental']) - base:+.2f} ms")


if __name__ == "__main__":
    main()
