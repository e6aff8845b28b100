"""This tree's recorder against a named baseline tree's, in one run, with the ratios printed.

    python benchmarks/compare_trees.py --baseline REF
        [--settings chain:8192:1,chain:8192:64] [--long chain:8192:1:100] [--reps 2] [--duration 10]
        [--targets baseline,recorder,capture,direct] [--out F.jsonl] [--docs docs/benchmarks.md]

Run it before resolving any change to the recorder's hot path or its store: a slowdown that no
timed test would catch (a wait on the indexer, a poll interval) shows here as a ratio. Every cell
starts fresh processes (``measure.run_cell``); the targets run alternated within each rep, so the
two trees see the same machine. The baseline is ``git archive REF openenv_harness`` unpacked in a
temporary folder, its recorder started from there with the same flags as ours.

Printed per setting: calls/s, latency p50 / p99 / max, recorder CPU per call (its index process
included), resident memory at the end, store bytes on disk at the end; then this tree ÷ baseline
and, where capture ran, ÷ capture. ``--long`` settings are single growing conversations (``T`` turns,
per-call latencies kept); for them the p99 over direct is printed where direct ran, and resident
memory and disk bytes are sampled every second.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import measure
import procs

TARGETS = ("baseline", "recorder", "capture", "direct")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="a git ref: the recorder to compare with")
    p.add_argument("--settings", default="chain:8192:1,chain:8192:64",
                   help="comma-separated mode:P:N[:turns][:stream] run for --duration seconds each ('' for none)")
    p.add_argument("--long", default="chain:8192:1:100", help="single-conversation settings ('' for none)")
    p.add_argument("--targets", default="baseline,recorder,capture,direct")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load per cell")
    p.add_argument("--quiet-wait", type=float, default=20.0, help="max seconds to wait for a quiet machine per cell")
    p.add_argument("--out", type=Path, default=None, help="results JSONL (default: a temporary file)")
    a = p.parse_args(argv)
    a.settings = [measure.Setting.parse(s) for s in a.settings.split(",") if s]
    a.long = [measure.Setting.parse(s) for s in a.long.split(",") if s]
    a.targets = [t for t in a.targets.split(",") if t]
    bad = set(a.targets) - set(TARGETS)
    if bad or "recorder" not in a.targets:
        p.error(f"targets are {', '.join(TARGETS)}, the recorder among them (got {', '.join(a.targets)})")
    if a.reps < 1:
        p.error("--reps must be at least 1")
    return a


def summarize(cells: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over reps of what the table shows."""
    def med(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return {
        "calls_s": med([c["load"]["throughput"] for c in cells]),
        "p50_ms": med([c["load"]["p50_ms"] for c in cells]),
        "p99_ms": med([c["load"]["p99_ms"] for c in cells]),
        "max_ms": med([c["load"]["max_ms"] for c in cells]),
        "cpu_ms": med([c["server"]["cpu_ms_per_call"] for c in cells]),
        "rss_mb": med([c["server"]["rss_end"] / 1e6 for c in cells]),
        "disk_mb": med([(c["samples"][-1][2] / 1e6) if c.get("samples") else None for c in cells]),
        "errors": sum(c["load"]["errors"] for c in cells),
    }


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}×"


def table(label: str, by_target: dict[str, dict[str, float | None]], commit: str, ref: str) -> list[str]:
    names = {"baseline": f"baseline `{ref[:10]}`", "recorder": f"this tree `{commit}`",
             "capture": "OpenEnv capture", "direct": "direct engine"}
    lines = [f"**{label}**", "",
             "| target | calls/s | p50 ms | p99 ms | max ms | server CPU ms/call | RSS MB (end) | disk MB (end) | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t, s in by_target.items():
        lines.append(f"| {names[t]} | {_fmt(s['calls_s'], '.0f')} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | "
                     f"{_fmt(s['max_ms'])} | {_fmt(s['cpu_ms'])} | {_fmt(s['rss_mb'], '.0f')} | "
                     f"{_fmt(s['disk_mb'], '.1f')} | {s['errors']} |")
    ours = by_target["recorder"]
    lines.append("")
    for other in ("baseline", "capture"):
        theirs = by_target.get(other)
        if theirs:
            lines.append(f"- this tree ÷ {names[other]}: calls/s {_ratio(ours['calls_s'], theirs['calls_s'])}, "
                         f"p99 {_ratio(ours['p99_ms'], theirs['p99_ms'])}, max {_ratio(ours['max_ms'], theirs['max_ms'])}, "
                         f"CPU/call {_ratio(ours['cpu_ms'], theirs['cpu_ms'])}, RSS {_ratio(ours['rss_mb'], theirs['rss_mb'])}")
    direct = by_target.get("direct")
    if direct and direct["p99_ms"] is not None:
        for t in ("baseline", "recorder"):
            s = by_target.get(t)
            if s and s["p99_ms"] is not None:
                lines.append(f"- {names[t]}: p99 {s['p99_ms'] - direct['p99_ms']:+.2f} ms over direct, "
                             f"p50 {s['p50_ms'] - direct['p50_ms']:+.2f} ms")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=procs.ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "openenv_harness"], cwd=procs.ROOT,
                                capture_output=True, text=True).stdout.strip())
    commit += "+changes" if dirty else ""
    tree = procs.baseline_tree(a.baseline, prefix="oeh-compare-base-") if "baseline" in a.targets else None
    out = a.out or Path(tempfile.mkstemp(prefix="oeh-compare-", suffix=".jsonl")[1])
    logs = Path(tempfile.mkdtemp(prefix="oeh-compare-logs-"))
    print(f"baseline {a.baseline} ({tree}) vs this tree {commit}; results {out}; logs {logs}", flush=True)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    started = time.monotonic()
    plan = [(s, False) for s in a.settings] + [(s, True) for s in a.long]
    with open(out, "ab") as sink:
        for setting, long_session in plan:
            for rep in range(1, a.reps + 1):
                order = a.targets if rep % 2 else [*reversed(a.targets)]  # alternated: no target always first
                for target in order:
                    procs.wait_for_quiet(a.quiet_wait)
                    cell = measure.run_cell(setting, target, duration=a.duration, logs=logs, rep=rep,
                                            long_session=long_session, tree=tree,
                                            sample_s=1.0 if long_session else 0.0)
                    cell.update(commit=commit, baseline=a.baseline)
                    sink.write(orjson.dumps(cell) + b"\n")
                    sink.flush()
                    cells.setdefault((setting.label, target), []).append(cell)
                    ld = cell["load"]
                    print(f"{setting.label:<22} {target:<9} rep {rep}: {ld['throughput']:7.0f}/s p50 {ld['p50_ms']:7.2f} "
                          f"p99 {ld['p99_ms']:7.2f} max {ld['max_ms']:7.2f} ms cpu "
                          f"{cell['server']['cpu_ms_per_call']:.2f} ms/call err {ld['errors']}", flush=True)
    args = sys.argv[1:] if argv is None else argv
    print(f"\ndone in {time.monotonic() - started:.0f} s: `python benchmarks/compare_trees.py {' '.join(args)}`\n")
    for setting, _ in plan:
        by_target = {t: summarize(cells[(setting.label, t)]) for t in a.targets if (setting.label, t) in cells}
        print("\n".join(table(setting.label, by_target, commit, a.baseline)))


if __name__ == "__main__":
    main()
