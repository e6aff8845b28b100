"""The recorder benchmark: direct engine vs recorder vs OpenEnv capture, one run, targets alternated.

    python benchmarks/run.py            # the full matrix (~15 min on 2 cores), writes docs/benchmarks.md
    python benchmarks/run.py --quick    # ~2 min smoke of the same path; prints the tables only

Settings are ``mode:prompt_tokens:sessions[:turns][:stream]`` (see ``measure.Setting.parse``). For
every setting the targets run in order A, B, C (and again per rep), each cell with fresh processes.
Results go to a JSONL file line by line, so an interrupted run keeps what it measured; the page is
rendered from that file by ``report.py`` / ``docs_page.py``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import measure
import procs
import report

FULL_SETTINGS = [f"{mode}:{p}:{n}" for mode in ("fixed", "chain") for p in (1024, 8192) for n in (1, 16, 64)]
FULL_SETTINGS.append("chain:8192:16:20:stream")
FULL_LONG = ["chain:8192:1:100", "fixed:8192:1:100"]
FULL_PROFILES = ["chain:8192:1", "chain:8192:64", "fixed:1024:64"]
QUICK_SETTINGS = ["fixed:1024:1", "fixed:8192:16", "chain:8192:64"]
QUICK_LONG = ["chain:8192:1:30"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark the recorder against the engine and OpenEnv capture")
    p.add_argument("--quick", action="store_true", help="small matrix, short cells, no page")
    p.add_argument("--duration", type=float, default=None, help="seconds of load per cell (10; quick: 3)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--settings", default=None, help="comma-separated mode:P:N[:turns][:stream]")
    p.add_argument("--long", default=None, help="long-session settings (one conversation each); '' for none")
    p.add_argument("--profile", default=None, help="settings to profile with py-spy after the matrix; '' for none")
    p.add_argument("--targets", default="direct,recorder,capture")
    p.add_argument("--no-floor", action="store_true",
                   help="leave out the baseline proxy (floor_proxy.py), which otherwise joins every non-streaming "
                        "setting the recorder runs")
    p.add_argument("--out", type=Path, default=None, help="results JSONL (default: benchmarks/results/ or a temp file)")
    p.add_argument("--docs", type=Path, default=None, help="page to write (default: docs/benchmarks.md unless --quick)")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=None, help="max seconds to wait for a quiet machine per cell")
    a = p.parse_args(argv)
    a.duration = a.duration if a.duration is not None else (3.0 if a.quick else 10.0)
    a.settings = [s for s in (a.settings.split(",") if a.settings is not None else
                              QUICK_SETTINGS if a.quick else FULL_SETTINGS) if s]
    a.long = [s for s in (a.long.split(",") if a.long is not None else QUICK_LONG if a.quick else FULL_LONG) if s]
    a.profile = [s for s in (a.profile.split(",") if a.profile is not None else [] if a.quick else FULL_PROFILES) if s]
    a.targets = [t for t in a.targets.split(",") if t]
    bad = set(a.targets) - set(report.TARGETS)
    if bad:
        p.error(f"unknown targets {sorted(bad)}")
    if a.quiet_wait is None:
        a.quiet_wait = 0.0 if a.quick else 2.0
    if a.out is None:
        a.out = (Path(tempfile.gettempdir()) / f"oeh-bench-{int(time.time())}.jsonl" if a.quick
                 else procs.BENCH / "results" / "latest.jsonl")
    if a.docs is None and not a.quick and not a.no_docs:
        a.docs = procs.ROOT / "docs" / "benchmarks.md"
    if a.no_docs:
        a.docs = None
    return a


def _progress(r: dict[str, Any]) -> str:
    load, s = r["load"], r["server"]
    return (f"{r['label']:<28} {r['target']:<8} calls={load['calls']:<6} {load['throughput']:8.0f}/s "
            f"p50={load['p50_ms']:7.2f} p99={load['p99_ms']:8.2f} ms cpu={s['cpu_ms_per_call']:5.2f} ms/call "
            f"rss={s['rss_end'] / report.MB:5.0f} MB bg={r.get('background_cores', 0):.2f} err={load['errors']}")


def run(a: argparse.Namespace, command: str) -> list[dict[str, Any]]:
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("")
    logs = Path(tempfile.mkdtemp(prefix="oeh-bench-logs-"))
    results: list[dict[str, Any]] = []
    commit = report.machine()["commit"]  # what was measured, recorded with every cell

    def keep(r: dict[str, Any]) -> None:
        r["commit"] = commit
        results.append(r)
        with a.out.open("ab") as f:
            f.write(orjson.dumps(r) + b"\n")

    print(f"results: {a.out}   logs: {logs}   code: {commit}", flush=True)
    t0 = time.monotonic()
    for text in a.settings:
        setting = measure.Setting.parse(text)
        targets = a.targets
        if not a.no_floor and "recorder" in targets and "floor" not in targets and not setting.stream:
            targets = [*targets, "floor"]
        for rep in range(1, a.reps + 1):
            for target in targets:
                procs.wait_for_quiet(a.quiet_wait)
                r = measure.run_cell(setting, target, duration=a.duration, logs=logs, rep=rep)
                keep(r)
                print(_progress(r), flush=True)
    for text in a.long:
        setting = measure.Setting.parse(text)
        for target in a.targets:
            procs.wait_for_quiet(a.quiet_wait)
            r = measure.run_cell(setting, target, duration=a.duration, logs=logs, long_session=True)
            r["long_session"] = True
            keep(r)
            print(_progress(r), flush=True)
    if a.profile:
        from profile_recorder import profile

        for text in a.profile:
            setting = measure.Setting.parse(text)
            procs.wait_for_quiet(a.quiet_wait)
            got = profile(setting.mode, setting.prompt_tokens, setting.sessions, min(a.duration, 8.0), logs)
            keep({"kind": "profile", "label": setting.label, "load": got["load"], "summary": got["summary"]})
            print(f"profiled {setting.label}: {got['load']['throughput']:.0f} calls/s", flush=True)
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    command = "python benchmarks/run.py " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    a = parse_args(argv)
    results = run(a, command.strip())
    print()
    print(report.main_table(results))
    print()
    print(report.resource_table(results))
    print()
    print(report.long_session_table(results))
    print(report.floor_table(results))
    print(report.targets_table(results))
    if a.docs:
        from docs_page import render_page

        a.docs.parent.mkdir(parents=True, exist_ok=True)
        a.docs.write_text(render_page(results, command=command.strip()))
        print(f"\nwrote {a.docs}")


if __name__ == "__main__":
    main()
