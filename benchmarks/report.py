"""Turn benchmark results (one dict per cell) into tables, target verdicts and ``docs/benchmarks.md``.

Kept apart from the runner so a results file can be re-rendered without re-measuring:
``python benchmarks/report.py results.jsonl --docs docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import subprocess
from pathlib import Path
from typing import Any
from collections.abc import Callable

import orjson

TARGETS = ("direct", "recorder", "capture", "floor")
MB = 1024 * 1024


def load_results(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _median(rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> float | None:
    values = [v for v in (get(r) for r in rows) if v is not None]
    return statistics.median(values) if values else None


def cells(results: list[dict[str, Any]], long_session: bool = False) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """label -> target -> runs (all reps), in first-seen order."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in results:
        if bool(r.get("long_session")) != long_session or r.get("kind") == "profile":
            continue
        out.setdefault(r["label"], {}).setdefault(r["target"], []).append(r)
    return out


def _f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _lat(runs: list[dict[str, Any]] | None) -> str:
    if not runs:
        return "–"
    p50 = _median(runs, lambda r: r["load"]["p50_ms"])
    p99 = _median(runs, lambda r: r["load"]["p99_ms"])
    thr = _median(runs, lambda r: r["load"]["throughput"])
    return f"{_f(p50)} / {_f(p99)} / {_f(thr, 0)}"


def summary_row(by_target: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The numbers one setting contributes to the tables and the target checks."""
    m = {t: by_target.get(t) or [] for t in TARGETS}
    row: dict[str, Any] = {}
    for t in TARGETS:
        runs = m[t]
        row[t] = None if not runs else {
            "p50": _median(runs, lambda r: r["load"]["p50_ms"]),
            "p99": _median(runs, lambda r: r["load"]["p99_ms"]),
            "thr": _median(runs, lambda r: r["load"]["throughput"]),
            "cpu": _median(runs, lambda r: r["server"]["cpu_ms_per_call"]),
            "main_cpu": _median(runs, lambda r: r["server"]["main_thread_cpu_ms_per_call"]),
            "other_cpu": _median(runs, lambda r: r["server"]["other_threads_cpu_ms_per_call"]),
            "child_cpu": _median(runs, lambda r: r["server"].get("child_processes_cpu_ms_per_call", 0.0)),
            "engine_cpu": _median(runs, lambda r: r["server"]["engine_cpu_ms_per_call"]),
            "rss0": _median(runs, lambda r: r["server"]["rss_start"]),
            "rss1": _median(runs, lambda r: r["server"]["rss_end"]),
            "calls": _median(runs, lambda r: r["load"]["calls"]),
            "errors": sum(r["load"]["errors"] for r in runs),
            "prompt": _median(runs, lambda r: r["load"]["mean_prompt_tokens"]),
            "bg": _median(runs, lambda r: r.get("background_cores")),
            "store_per_call": _median(runs, lambda r: (r["store"]["logical_bytes"] / max(1, r["store"]["records"]))
                                      if r.get("store") else None),
        }
    return row


def main_table(results: list[dict[str, Any]]) -> str:
    head = ("| setting | mean prompt | direct p50 / p99 ms / calls/s | recorder p50 / p99 ms / calls/s | "
            "capture p50 / p99 ms / calls/s | recorder added p50 / p99 ms | recorder ÷ direct | recorder ÷ capture |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for label, by_target in cells(results).items():
        row = summary_row(by_target)
        d, r, c = row["direct"], row["recorder"], row["capture"]
        added = f"+{_f(r['p50'] - d['p50'])} / +{_f(r['p99'] - d['p99'])}" if d and r else "–"
        vs_d = f"{r['thr'] / d['thr']:.2f}×" if d and r and d["thr"] else "–"
        vs_c = f"{r['thr'] / c['thr']:.2f}×" if c and r and c["thr"] else "–"
        prompt = next((x["prompt"] for x in (d, r, c) if x), None)
        lines.append(f"| {label} | {_f(prompt, 0)} | {_lat(by_target.get('direct'))} | {_lat(by_target.get('recorder'))} "
                     f"| {_lat(by_target.get('capture'))} | {added} | {vs_d} | {vs_c} |")
    return "\n".join(lines)


def resource_table(results: list[dict[str, Any]]) -> str:
    head = ("| setting | recorder CPU ms/call (event loop + other threads + index process) | capture CPU ms/call "
            "| engine CPU ms/call (direct / behind recorder) | recorder RSS start → end MB (with its index process) "
            "| capture RSS start → end MB | "
            "recorder store bytes/call | background cores A / B / C | errors |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for label, by_target in cells(results).items():
        row = summary_row(by_target)
        d, r, c = row["direct"], row["recorder"], row["capture"]
        rcpu = f"{_f(r['cpu'])} ({_f(r['main_cpu'])} + {_f(r['other_cpu'])} + {_f(r['child_cpu'])})" if r else "–"
        ccpu = _f(c["cpu"]) if c else "–"
        ecpu = f"{_f(d['engine_cpu'] if d else None)} / {_f(r['engine_cpu'] if r else None)}"
        rrss = f"{_f(r['rss0'] / MB, 0)} → {_f(r['rss1'] / MB, 0)}" if r else "–"
        crss = f"{_f(c['rss0'] / MB, 0)} → {_f(c['rss1'] / MB, 0)}" if c else "–"
        store = _f(r["store_per_call"], 0) if r else "–"
        bg = " / ".join(_f(x["bg"]) if x else "–" for x in (d, r, c))
        errors = sum(x["errors"] for x in (d, r, c) if x)
        lines.append(f"| {label} | {rcpu} | {ccpu} | {ecpu} | {rrss} | {crss} | {store} | {bg} | {errors} |")
    return "\n".join(lines)


def floor_table(results: list[dict[str, Any]]) -> str:
    """Settings where the baseline proxy ran: how much of the recorder's cost is the hop itself."""
    head = ("| setting | direct p50 / p99 ms, calls/s | floor proxy p50 / p99 ms (added), calls/s "
            "| recorder p50 / p99 ms (added), calls/s | recorder over the floor p50 / p99 ms "
            "| floor ÷ direct / recorder ÷ direct | CPU ms/call floor / recorder |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for label, by_target in cells(results).items():
        row = summary_row(by_target)
        d, f, r = row["direct"], row["floor"], row["recorder"]
        if not (d and f and r):
            continue
        ratio = (lambda x: f"{x['thr'] / d['thr']:.2f}×") if d["thr"] else (lambda x: "–")
        lines.append(
            f"| {label} | {_f(d['p50'])} / {_f(d['p99'])}, {_f(d['thr'], 0)} "
            f"| {_f(f['p50'])} / {_f(f['p99'])} (+{_f(f['p50'] - d['p50'])} / +{_f(f['p99'] - d['p99'])}), {_f(f['thr'], 0)} "
            f"| {_f(r['p50'])} / {_f(r['p99'])} (+{_f(r['p50'] - d['p50'])} / +{_f(r['p99'] - d['p99'])}), {_f(r['thr'], 0)} "
            f"| +{_f(r['p50'] - f['p50'])} / +{_f(r['p99'] - f['p99'])} | {ratio(f)} / {ratio(r)} "
            f"| {_f(f['cpu'])} / {_f(r['cpu'])} |")
    return "\n".join(lines) if len(lines) > 1 else ""


def _window_p50(per_call: list[list[float]], lo: int, hi: int) -> float | None:
    values = sorted(ms for turn, ms, _ in per_call if lo <= turn <= hi)
    return statistics.median(values) if values else None


def long_session_table(results: list[dict[str, Any]]) -> str:
    def settled(r: dict[str, Any]) -> str:
        return f" → {_f(r['rss_settled'] / MB, 0)} settled" if r.get("rss_settled") is not None else ""

    lines = []
    for label, by_target in cells(results, long_session=True).items():
        lines.append(f"**{label}**\n")
        lines.append("| target | p50 / p99 ms (whole session) | p50 ms turns 0–9 / 45–54 / 90–99 | final prompt ids "
                     "| CPU ms/call | RSS start → end (→ settled) MB |\n|---|---|---|---|---|---|")
        for t in TARGETS:
            runs = by_target.get(t)
            if not runs:
                continue
            r = runs[0]
            load, per_call = r["load"], r["load"].get("per_call") or []
            turns = max((row[0] for row in per_call), default=0)
            mid = turns // 2
            windows = " / ".join(_f(_window_p50(per_call, lo, hi)) for lo, hi in
                                 ((0, 9), (mid - 5, mid + 4), (turns - 9, turns)))
            lines.append(f"| {t} | {_f(load['p50_ms'])} / {_f(load['p99_ms'])} | {windows} | {load['max_prompt_tokens']:,} "
                         f"| {_f(r['server']['cpu_ms_per_call'])} | {_f(r['server']['rss_start'] / MB, 0)} → "
                         f"{_f(r['server']['rss_end'] / MB, 0)}{settled(r)} |")
        rec = (by_target.get("recorder") or [None])[0]
        if rec and rec.get("store", {}).get("session"):
            lines.append("\n" + storage_line(rec))
        lines.append("")
    return "\n".join(lines)


def storage_numbers(rec: dict[str, Any]) -> dict[str, Any]:
    session = rec["store"]["session"]["total"]
    back = rec.get("readback") or {}
    final_ids = (back["final_prompt_ids"] + back["final_completion_ids"] if back.get("final_prompt_ids")
                 else rec["load"]["max_prompt_tokens"] + 50)
    return {"stored": session, "final_id_bytes": 4 * final_ids, "ratio": session / (4 * final_ids),
            "readback_s": back.get("seconds"), "readback_bytes": back.get("json_bytes"),
            "fidelity": back.get("fidelity"), "records": back.get("records")}


def storage_line(rec: dict[str, Any]) -> str:
    n = storage_numbers(rec)
    return (f"Recorder store for this session: **{n['stored']:,} bytes** (rows + the blobs it references) vs "
            f"{n['final_id_bytes']:,} bytes for its final prompt+completion ids at 4 B/id: **{n['ratio']:.2f}×**. "
            f"Reading its {n['records']} records back (`GET /admin/sessions/{{id}}/records`): "
            f"{_f(n['readback_s'], 2)} s, {(n['readback_bytes'] or 0) / MB:.1f} MB JSON; chain classes {n['fidelity']}.")


#: (target, measured, met?, what the baseline proxy reached on the same check, or None)
Check = tuple[str, str, bool | None, str | None]


def target_checks(results: list[dict[str, Any]]) -> list[Check]:
    """One row per target of the recorder, from whatever was measured. Where the baseline proxy ran the
    same setting, its value on the same check says whether any Python proxy hop meets it here."""
    checks: list[Check] = []
    table = {label: summary_row(bt) for label, bt in cells(results).items()}
    for label, row in table.items():
        d, r, c, f = row["direct"], row["recorder"], row["capture"], row["floor"]
        if not (d and r):
            continue
        setting = label.split()
        if "P=8k" in setting and "N=1" in setting and "stream" not in setting:
            a50, a99 = r["p50"] - d["p50"], r["p99"] - d["p99"]
            checks.append((f"{label}: added p50 ≤ 1 ms", f"+{a50:.2f} ms", a50 <= 1.0,
                           f"+{f['p50'] - d['p50']:.2f} ms" if f else None))
            checks.append((f"{label}: added p99 ≤ 3 ms", f"+{a99:.2f} ms", a99 <= 3.0,
                           f"+{f['p99'] - d['p99']:.2f} ms" if f else None))
        if "N=64" in setting:
            if c and c["thr"]:
                x = r["thr"] / c["thr"]
                checks.append((f"{label}: throughput ≥ 3× capture", f"{x:.2f}×", x >= 3.0,
                               f"{f['thr'] / c['thr']:.2f}×" if f else None))
            x = r["thr"] / d["thr"] if d["thr"] else 0.0
            checks.append((f"{label}: throughput ≥ 0.5× direct", f"{x:.2f}×", x >= 0.5,
                           f"{f['thr'] / d['thr']:.2f}×" if f and d["thr"] else None))
            checks.append((f"{label}: p99 ≤ 50 ms", f"{r['p99']:.1f} ms (direct: {d['p99']:.1f})", r["p99"] <= 50.0,
                           f"{f['p99']:.1f} ms" if f else None))
            checks.append((f"{label}: recorder RSS ≤ 200 MB after the load", f"{r['rss1'] / MB:.0f} MB",
                           r["rss1"] <= 200 * MB, None))
    for label, by_target in cells(results, long_session=True).items():
        rec = (by_target.get("recorder") or [None])[0]
        if not rec:
            continue
        settled = rec.get("rss_settled")
        if settled is not None:  # held memory, once the last call's buffers are handed back
            growth = (settled - rec["server"]["rss_start"]) / MB
            checks.append((f"{label}: RSS held after the session does not grow with its history (≤ 20 MB)",
                           f"{growth:+.1f} MB", growth <= 20.0, None))
        else:  # results measured before the settled reading existed
            growth = (rec["server"]["rss_end"] - rec["server"]["rss_start"]) / MB
            checks.append((f"{label}: RSS does not grow with session history (≤ 20 MB over the session)",
                           f"{growth:+.1f} MB", growth <= 20.0, None))
        if rec.get("store", {}).get("session") and label.startswith("chain"):
            n = storage_numbers(rec)
            checks.append((f"{label}: stored ≤ 3× final prompt+completion ids (4 B/id)", f"{n['ratio']:.2f}×",
                           n["ratio"] <= 3.0, None))
    return checks


def targets_table(results: list[dict[str, Any]]) -> str:
    checks = target_checks(results)
    with_floor = any(floor is not None for *_, floor in checks)
    lines = ["| target | measured | met? |" + (" baseline proxy, same run |" if with_floor else ""),
             "|---|---|---|" + ("---|" if with_floor else "")]
    for name, measured, met, floor in checks:
        extra = f" {floor or '–'} |" if with_floor else ""
        lines.append(f"| {name} | {measured} | {'yes' if met else '**no**'} |{extra}")
    return "\n".join(lines)


def raw_table(results: list[dict[str, Any]]) -> str:
    lines = ["| run | calls | window s | p50 | p90 | p99 | max ms | calls/s | mean prompt | server CPU ms/call "
             "| engine CPU ms/call | lg CPU ms/call | RSS start→end MB | bg cores | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("kind") == "profile":
            continue
        load, s = r["load"], r["server"]
        changed = " (recorder code changed during this cell)" if r.get("code_before") != r.get("code_after") else ""
        lines.append(
            f"| {r['label']} {r['target']} r{r['rep']}{changed} | {load['calls']} | {_f(load['window_s'], 1)} | {_f(load['p50_ms'])} "
            f"| {_f(load['p90_ms'])} | {_f(load['p99_ms'])} | {_f(load['max_ms'], 1)} | {_f(load['throughput'], 0)} "
            f"| {_f(load['mean_prompt_tokens'], 0)} | {_f(s['cpu_ms_per_call'])} | {_f(s['engine_cpu_ms_per_call'])} "
            f"| {_f(load['lg_cpu_ms_per_call'])} | {_f(s['rss_start'] / MB, 0)}→{_f(s['rss_end'] / MB, 0)} "
            f"| {_f(r.get('background_cores'))} | {load['errors']} |")
    return "\n".join(lines)


# -- machine and software facts --------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("openenv-harness", "openenv", "uvicorn", "uvloop", "httptools", "fastapi", "starlette", "httpx",
                 "httpcore", "h11", "orjson", "pysimdjson", "numpy", "zstandard", "prometheus-client", "aiohttp", "py-spy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        # the run's own outputs (results, the page) do not make the measured code "changed"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results", ":!docs/benchmarks.md"],
                               cwd=root, capture_output=True, text=True).stdout.strip()
    except OSError:
        head, dirty = "unknown", ""
    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": f"{int(mem) / 1024 / 1024:.0f} GiB",
            "kernel": platform.release(), "commit": head + (" + uncommitted changes" if dirty else "")}


def main(argv: list[str] | None = None) -> None:
    from docs_page import render_page

    p = argparse.ArgumentParser(description="Render benchmark results")
    p.add_argument("results", type=Path)
    p.add_argument("--docs", type=Path, default=None)
    p.add_argument("--command", default="python benchmarks/run.py")
    p.add_argument("--earlier", type=Path, default=None, help="an earlier complete run to include")
    p.add_argument("--earlier-title", default="Earlier run")
    p.add_argument("--earlier-command", default="python benchmarks/run.py")
    p.add_argument("--notes", type=Path, default=None, help="hand-written findings for this run (markdown)")
    a = p.parse_args(argv)
    results = load_results(a.results)
    print(main_table(results) + "\n\n" + resource_table(results) + "\n\n" + long_session_table(results)
          + "\n" + targets_table(results))
    if a.docs:
        earlier = load_results(a.earlier) if a.earlier else None
        notes = a.notes.read_text() if a.notes else ""
        a.docs.write_text(render_page(results, command=a.command, earlier=earlier, earlier_title=a.earlier_title,
                                      earlier_command=a.earlier_command, notes=notes))
        print(f"wrote {a.docs}")


if __name__ == "__main__":
    main()
