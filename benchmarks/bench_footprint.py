"""The recorder's steady-state footprint: disk over a long run, memory per open session, memory after
a large read, and admin calls while sessions run flat out -- this tree against a baseline, one run.

    python benchmarks/bench_footprint.py --baseline REF [--disk-s 180] [--idle-sessions 1000] [--out F.json]
    python benchmarks/bench_footprint.py --quick     # a minute-long smoke of every part

Every part starts a fresh lean engine and a fresh recorder (its CLI, defaults) per code version, and
runs the two versions alternately (baseline, this tree), so both see the same machine. The baseline is
``git archive REF openenv_harness`` unpacked in a temporary directory; its recorder runs from there.

- **disk**: N sessions (chain mode: every prompt is the whole conversation, growing ≈ 565 ids a
  turn from P) run back to back; every ``--sample-s`` seconds the store directory's bytes on disk
  (SQLite file, its WAL, the journal's segments) are read beside the logical bytes of what is
  indexed (record and blob lengths, as ``measure.store_bytes`` counts them).
- **sessions**: ``--idle-sessions`` sessions each make ``--idle-turns`` calls at P ids and stay open;
  resident memory of the recorder and its index process is read at every quarter of them. The
  slope (bytes per open session) is what each session holds between calls.
- **read**: one session of ``--read-turns`` turns from P (its records' JSON is tens of MB) is read back
  through ``GET /admin/sessions/{id}/records``; resident memory before it, just after, and each
  second for ``--settle-s`` seconds.
- **admin**: while N sessions run flat out, a trainer-like client creates and closes a session
  every 20 ms; the create and close latencies, and the chat calls' own, are reported.
- **chain**: one session in chain mode at P ids (and at each ``--chain-prompts``) for ``--chain-s``
  seconds, ``--chain-reps`` alternated cells per version: what the per-session holdings cost (or
  save) on the common path, as latency seen by the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import loadgen
import measure
import procs

MB = 1 << 20


def baseline_tree(ref: str) -> Path:
    return procs.baseline_tree(ref, prefix="oeh-footprint-base-")


def recorder(tree: Path, engine_url: str, store: Path, admin: str, logs: Path) -> procs.Proc:
    proc = procs.recorder_proc(engine_url, store, admin, logs)
    proc.cwd = tree
    return proc


def store_disk_bytes(db: Path) -> dict[str, int]:
    journal = db.with_name(db.name + ".records-log")
    segs = sum(p.stat().st_size for p in journal.glob("records-*.log")) if journal.is_dir() else 0
    size = lambda p: p.stat().st_size if p.exists() else 0  # noqa: E731
    return {"db": size(db), "wal": size(db.with_name(db.name + "-wal")), "journal": segs}


def _logical(db: Path) -> int:
    try:
        return measure.store_bytes(db)["logical_bytes"]
    except Exception:  # noqa: BLE001 -- the schema may not exist yet at the first sample
        return 0


def _loadgen_argv(url: str, admin: str, prompt: int, sessions: int, turns: int, duration: float) -> list[str]:
    return [procs.PYTHON, str(procs.BENCH / "loadgen.py"), "--url", url, "--target", "recorder",
            f"--admin-token={admin}", "--prompt-tokens", str(prompt), "--turns", str(turns),
            "--sessions", str(sessions), "--duration", str(duration)]


# -- disk ---------------------------------------------------------------------------------------------


def disk_part(tree: Path, a: argparse.Namespace, logs: Path) -> dict[str, Any]:
    admin = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="oeh-footprint-") as tmp, \
            procs.engine_proc("chain", a.prompt, logs) as engine:
        db = Path(tmp) / "store.db"
        proxy = recorder(tree, engine.url, db, admin, logs).start(timeout_s=120)
        samples: list[dict[str, Any]] = []
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.wait(a.sample_s):
                disk = store_disk_bytes(db)
                samples.append({"t": round(time.monotonic() - t0, 1), **disk, "logical": _logical(db),
                                "rss": procs.tree_rss_bytes(proxy.pid)})

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            load = procs.run_json(_loadgen_argv(proxy.url, admin, a.prompt, a.sessions, a.disk_turns, a.disk_s),
                                  a.disk_s + 900)
        finally:
            stop.set()
            thread.join()
            proxy.stop()
        after = {**store_disk_bytes(db), "logical": _logical(db)}
    load.pop("session_ids", None)
    return {"samples": samples, "after_stop": after, "load": load}


# -- memory per open session ----------------------------------------------------------------------------


async def _open_sessions(url: str, admin: str, count: int, turns: int, prompt: int,
                         on_quarter: Any) -> list[str]:
    gen = loadgen.LoadGen(loadgen.Target("recorder", url, admin),
                          argparse.Namespace(seed=7, prompt_tokens=prompt, stream=False, tool_bytes=2048))
    ids: list[str] = []
    # a fresh connection per request: the settling pauses outlast the server's keep-alive timeout
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def one(number: int) -> None:
            conv = loadgen.Conversation(gen.system, f"Task {number}".ljust(loadgen.USER_CHARS), False, False)
            chat, key, sid = await gen.open_session(http, number)
            ids.append(sid or "")
            for _ in range(turns):
                async with http.post(chat, data=conv.body(), headers={"authorization": f"Bearer {key}",
                                                                      "content-type": "application/json"}) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"chat -> {r.status}: {raw[:200]!r}")
                echo, _ = loadgen.check_reply("recorder", raw, False)
                conv.add(echo)
                conv.add({"role": "tool", "tool_call_id": echo["tool_calls"][0]["id"], "content": gen.pool[:2048]})

        step = max(1, count // 4)
        for start in range(0, count, step):
            sem = asyncio.Semaphore(16)

            async def bounded(n: int) -> None:
                async with sem:
                    await one(n)

            await asyncio.gather(*(bounded(n) for n in range(start, min(count, start + step))))
            on_quarter(min(count, start + step))
    return ids


def sessions_part(tree: Path, a: argparse.Namespace, logs: Path, prompt: int) -> dict[str, Any]:
    admin = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="oeh-footprint-") as tmp, \
            procs.engine_proc("chain", prompt, logs) as engine:
        proxy = recorder(tree, engine.url, Path(tmp) / "store.db", admin, logs).start(timeout_s=120)
        try:
            time.sleep(1.5)
            points = [(0, procs.tree_rss_bytes(proxy.pid))]

            def settle_and_read(n: int) -> None:
                time.sleep(a.settle_s)  # the last calls' buffers freed and trimmed (heap trimmer: 1 s)
                points.append((n, procs.tree_rss_bytes(proxy.pid)))

            asyncio.run(_open_sessions(proxy.url, admin, a.idle_sessions, a.idle_turns, prompt, settle_and_read))
        finally:
            proxy.stop()
    (n0, r0), (n1, r1) = points[0], points[-1]
    return {"prompt": prompt, "turns": a.idle_turns, "points": points,
            "bytes_per_session": (r1 - r0) / max(1, n1 - n0)}


# -- memory after a large read ---------------------------------------------------------------------------


def _admin_get(url: str, admin: str, path: str) -> bytes:
    req = urllib.request.Request(url + path, headers={"authorization": f"Bearer {admin}"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def read_part(tree: Path, a: argparse.Namespace, logs: Path) -> dict[str, Any]:
    admin = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="oeh-footprint-") as tmp, \
            procs.engine_proc("chain", a.prompt, logs) as engine:
        proxy = recorder(tree, engine.url, Path(tmp) / "store.db", admin, logs).start(timeout_s=120)
        try:
            argv = _loadgen_argv(proxy.url, admin, a.prompt, 1, a.read_turns, 1e9) + ["--max-conversations", "1"]
            load = procs.run_json(argv, 900)
            sid = load["session_ids"][0]
            time.sleep(a.settle_s)
            before = procs.tree_rss_bytes(proxy.pid)
            t0 = time.perf_counter()
            body = _admin_get(proxy.url, admin, f"/admin/sessions/{sid}/records?format=json")
            seconds = time.perf_counter() - t0
            after = [procs.tree_rss_bytes(proxy.pid)]
            for _ in range(int(a.settle_s * 2)):
                time.sleep(1.0)
                after.append(procs.tree_rss_bytes(proxy.pid))
            entries = orjson.loads(body)
        finally:
            proxy.stop()
    return {"records": len(entries), "json_bytes": len(body), "read_s": seconds, "rss_before": before,
            "rss_after": after, "final_prompt_ids": len(entries[-1]["prompt_token_ids"]) if entries else 0}


# -- admin calls under load ------------------------------------------------------------------------------


async def _admin_probe(url: str, admin: str, until: float, every_s: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create": [], "close": []}
    headers = {"authorization": f"Bearer {admin}"}
    async with aiohttp.ClientSession() as http:
        n = 0
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            async with http.post(f"{url}/admin/sessions", headers=headers,
                                 json={"harness": "probe", "metadata": {"n": n}}) as r:
                data = await r.json(loads=orjson.loads)
                assert r.status == 201, data
            t1 = time.perf_counter()
            async with http.post(f"{url}/admin/sessions/{data['session_id']}/close", headers=headers) as r:
                await r.read()
                assert r.status == 200
            t2 = time.perf_counter()
            out["create"].append((t1 - t0) * 1000)
            out["close"].append((t2 - t1) * 1000)
            n += 1
            await asyncio.sleep(max(0.0, every_s - (t2 - t0)))
    return out


def _load_average() -> float:
    return os.getloadavg()[0]


def admin_part(tree: Path, a: argparse.Namespace, logs: Path, *, listener: bool = False,
               switch_s: str | None = None, null_admin: str | None = None) -> dict[str, Any]:
    """``listener``: the recorder runs with ``--admin-port`` and the probe creates and closes there
    (the chat load and everything else unchanged); otherwise through the main port, as before.
    ``switch_s``: the recorder's ``sys.setswitchinterval`` (None: Python's default, 5 ms).
    ``null_admin``: the probe goes to ``null_admin.py`` instead, which answers with constants --
    ``"thread"``: on a thread of the recorder's interpreter, ``"process"``: in a process of its own,
    both at the listener's default ``admin_nice`` -- the floor under any admin server there."""
    admin = secrets.token_hex(16)
    side: subprocess.Popen | None = None
    with tempfile.TemporaryDirectory(prefix="oeh-footprint-") as tmp, \
            procs.engine_proc("chain", a.prompt, logs) as engine:
        proc = recorder(tree, engine.url, Path(tmp) / "store.db", admin, logs)
        switch = switch_s or os.environ.get("OEH_BENCH_SWITCH_INTERVAL_S")
        prelude = []
        if switch:  # A/B of the interpreter's switch interval in the recorder (how long a waiting thread waits)
            prelude.append(f"sys.setswitchinterval({float(switch)!r})")
        admin_port = procs.free_port() if listener or null_admin else None
        if null_admin == "thread":
            prelude.append(f"sys.path.insert(0, {str(procs.BENCH)!r}); import null_admin; "
                           f"null_admin.start_in_thread({admin_port}, {NULL_ADMIN_NICE})")
        elif null_admin == "process":
            side = subprocess.Popen([procs.PYTHON, str(procs.BENCH / "null_admin.py"), str(admin_port),
                                     str(NULL_ADMIN_NICE)], stdout=subprocess.PIPE)
            assert side.stdout is not None and side.stdout.readline()  # it says when it serves
        if prelude:
            assert proc.argv[1:3] == ["-m", "openenv_harness.recorder"], proc.argv
            proc.argv[1:3] = ["-c", "import sys, runpy; " + "; ".join(prelude) + "; "
                              "sys.argv[0] = 'recorder'; runpy.run_module('openenv_harness.recorder', run_name='__main__')"]
        if listener:
            proc.argv += ["--admin-port", str(admin_port)]
        proxy = proc.start(timeout_s=120)
        probe_url = f"http://127.0.0.1:{admin_port}" if admin_port is not None else proxy.url
        load_before = _load_average()
        try:
            argv = _loadgen_argv(proxy.url, admin, a.prompt, a.sessions, 20, a.admin_s)
            lg = subprocess.Popen(argv, cwd=procs.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(2.0)  # the load is up
            own = os.getpriority(os.PRIO_PROCESS, 0)
            if a.probe_nice:  # the trainer on cores of its own: its wake-ups are not part of the recorder's answer
                os.setpriority(os.PRIO_PROCESS, 0, own + a.probe_nice)  # this thread only; the children started before
            try:
                probe = asyncio.run(_admin_probe(probe_url, admin, time.perf_counter() + a.admin_s - 3.0, 0.02))
            finally:
                if a.probe_nice:
                    os.setpriority(os.PRIO_PROCESS, 0, own)
            out, err = lg.communicate(timeout=a.admin_s + 600)
            if lg.returncode != 0:
                raise RuntimeError(f"loadgen failed: {err.decode()[-2000:]}")
            load = orjson.loads(out.decode().strip().splitlines()[-1])
        finally:
            proxy.stop()
            if side is not None:
                side.kill()
                side.wait()
    load.pop("session_ids", None)
    pct = lambda xs, q: loadgen.percentile(sorted(xs), q)  # noqa: E731
    return {"load": load, "listener": listener, "null_admin": null_admin, "probe_nice": a.probe_nice, "switch_interval_s": float(switch) if switch else None, "load_average": [load_before, _load_average()],
            **{f"{k}_p50_ms": pct(v, 50) for k, v in probe.items()},
            **{f"{k}_p99_ms": pct(v, 99) for k, v in probe.items()},
            **{f"{k}_max_ms": max(v) for k, v in probe.items()}, "probes": len(probe["create"])}


#: the null admin server's nice steps: the recorder's default ``admin_nice`` for its listener
NULL_ADMIN_NICE = -10


# -- one session's chain latency ---------------------------------------------------------------------------


def chain_part(tree: Path, a: argparse.Namespace, logs: Path, prompt: int) -> dict[str, Any]:
    admin = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="oeh-footprint-") as tmp, \
            procs.engine_proc("chain", prompt, logs) as engine:
        proxy = recorder(tree, engine.url, Path(tmp) / "store.db", admin, logs).start(timeout_s=120)
        try:
            load = procs.run_json(_loadgen_argv(proxy.url, admin, prompt, 1, 100, a.chain_s), a.chain_s + 600)
        finally:
            proxy.stop()
    load.pop("session_ids", None)
    return {"prompt": prompt, **{k: load[k] for k in ("calls", "p50_ms", "p90_ms", "p99_ms", "throughput")}}


# -- the run ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", default=None, help="git ref to compare with (default: none, this tree only)")
    p.add_argument("--parts", default="admin,read,sessions,disk")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--prompt", type=int, default=8192, help="first prompt, ids")
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--disk-s", type=float, default=180.0)
    p.add_argument("--disk-turns", type=int, default=100, help="turns per conversation in the disk run")
    p.add_argument("--sample-s", type=float, default=3.0)
    p.add_argument("--idle-sessions", type=int, default=1000)
    p.add_argument("--idle-turns", type=int, default=2)
    p.add_argument("--idle-prompts", default="8192,65536", help="first prompts of the open-sessions part")
    p.add_argument("--read-turns", type=int, default=100)
    p.add_argument("--admin-s", type=float, default=20.0)
    p.add_argument("--admin-reps", type=int, default=2, help="admin cells per version, alternated")
    p.add_argument("--switch-intervals", default=None,
                   help="admin part: the recorder's sys.setswitchinterval values to alternate, seconds (e.g. 0.005,0.001)")
    p.add_argument("--probe-nice", type=int, default=0,
                   help="admin part: nice steps for the probing client's thread (e.g. -10: a trainer on cores of its own)")
    p.add_argument("--admin-listener", action="store_true",
                   help="admin part: this tree also with --admin-port, the probe on that port (alternated with the main port)")
    p.add_argument("--admin-floor", action="store_true",
                   help="admin part: also null admin servers (null_admin.py: constant answers) on a thread of the "
                        "recorder's interpreter and in a process of their own, alternated with the other cells")
    p.add_argument("--settle-s", type=float, default=3.0)
    p.add_argument("--chain-s", type=float, default=15.0)
    p.add_argument("--chain-reps", type=int, default=3)
    p.add_argument("--chain-prompts", default="8192,32768", help="first prompts of the one-session chain part")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--docs", type=Path, default=None, help="write the section into this page (docs/benchmarks.md)")
    p.add_argument("--render", type=Path, default=None, help="only render RESULTS.json into --docs (no run)")
    a = p.parse_args(argv)
    if a.quick:
        a.disk_s, a.idle_sessions, a.read_turns, a.admin_s, a.disk_turns = 20.0, 40, 20, 8.0, 30
        a.idle_prompts = "8192"
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.render is not None:
        write_docs(a.docs or procs.ROOT / "docs" / "benchmarks.md", page_section(a.render) or "")
        return
    logs = Path(tempfile.mkdtemp(prefix="oeh-footprint-logs-"))
    trees = {"this": procs.ROOT}
    base = None
    if a.baseline:
        base = baseline_tree(a.baseline)
        trees = {"baseline": base, **trees}
    results: dict[str, Any] = {"command": "python benchmarks/bench_footprint.py " + " ".join(sys.argv[1:]),
                               "baseline": a.baseline, "started_at": time.time(),
                               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=procs.ROOT,
                                                        capture_output=True, text=True).stdout.strip(),
                               "parts": {}}
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def keep(part: str, name: str, value: Any) -> None:
        results["parts"].setdefault(part, {})[name] = value
        a.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(f"{part:<9} {name:<9} {_brief(part, value)}", flush=True)

    def run_part(part: str, name: str, tree: Path) -> None:
        if part == "disk":
            keep(part, name, disk_part(tree, a, logs))
        elif part == "read":
            keep(part, name, read_part(tree, a, logs))
        elif part == "sessions":
            keep(part, name, [sessions_part(tree, a, logs, int(p)) for p in a.idle_prompts.split(",")])
        elif part == "chain":
            runs = results["parts"].get("chain", {}).get(name, [])
            keep(part, name, [*runs, *(chain_part(tree, a, logs, int(p)) for p in a.chain_prompts.split(","))])

    try:
        for part in a.parts.split(","):
            for rep in range({"admin": a.admin_reps, "chain": a.chain_reps}.get(part, 1)):
                for name, tree in trees.items():  # alternated: baseline, this, baseline, this, ...
                    if part == "admin":
                        # (listener, null admin) per cell; the order turns around every other rep
                        modes: list[tuple[bool, str | None]] = [(False, None)]
                        if name == "this" and a.admin_listener:
                            modes.append((True, None))
                        if name == "this" and a.admin_floor:
                            modes += [(False, "thread"), (False, "process")]
                        switches = a.switch_intervals.split(",") if a.switch_intervals and name == "this" else [None]
                        for switch in (switches if rep % 2 == 0 else switches[::-1]):
                            for listener, null in (modes if rep % 2 == 0 else modes[::-1]):
                                key = (f"{name}+listener" if listener else f"{name}+null-{null}" if null else name) \
                                    + (f"@{switch}" if switch else "")
                                runs = results["parts"].get("admin", {}).get(key, [])
                                keep(part, key, [*runs, admin_part(tree, a, logs, listener=listener, switch_s=switch,
                                                                   null_admin=null)])
                    else:
                        run_part(part, name, tree)
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"wrote {a.out}")
    if a.docs is not None:
        write_docs(a.docs, page_section(a.out) or "")
        print(f"wrote {a.docs}")


def _ratio(s: dict[str, int]) -> float:
    return (s["db"] + s["wal"] + s["journal"]) / s["logical"] if s["logical"] else float("inf")


def admin_table(results: dict[str, Any], *, own_command: bool = False) -> list[str]:
    """The "Admin calls under load" table (and, for a run of its own, its command)."""
    label = {"baseline": f"before (`{(results.get('baseline') or '')[:7]}`)", "this": f"main port (`{results['commit']}`)",
             "this+listener": f"admin listener (`{results['commit']}`)",
             "this+null-thread": "null admin server, a thread of the recorder's interpreter",
             "this+null-process": "null admin server, a process of its own"}
    if not own_command:
        label["this"] = f"this tree (`{results['commit']}`)"
    out = ["**Admin calls under load** (a client creates and closes a session every 20 ms while 64 sessions "
           "run flat out, chain mode from 8k ids" + (f"; `{results['command']}`, cells alternated, load = the "
           "1-minute load average before → after each cell" if own_command else "") + ").", "",
           "| version | run | create p50 / p99 / max ms | close p50 / p99 / max ms | probes | chat p50 / p99 ms | chat calls/s | load |",
           "|---|---|---|---|---|---|---|---|"]
    for key, runs in results["parts"]["admin"].items():
        base, _, switch = key.partition("@")
        name = label.get(base, base) + (f", switch interval {float(switch) * 1000:g} ms" if switch else "")
        for i, v in enumerate(runs if isinstance(runs, list) else [runs], 1):
            out.append(f"| {name} | {i} | {v['create_p50_ms']:.1f} / {v['create_p99_ms']:.1f} / "
                       f"{v['create_max_ms']:.1f} | {v['close_p50_ms']:.1f} / {v['close_p99_ms']:.1f} / "
                       f"{v['close_max_ms']:.1f} | {v['probes']} | {v['load']['p50_ms']:.1f} / "
                       f"{v['load']['p99_ms']:.1f} | {v['load']['throughput']:.0f} | "
                       + (" → ".join(f"{x:.1f}" for x in v["load_average"]) if "load_average" in v else "-") + " |")
    return out + [""]


def render_section(results: dict[str, Any], admin: dict[str, Any] | None = None) -> str:
    """The page's "Steady-state footprint" section from one results file (``--docs`` writes it);
    ``admin``: a run of the admin part of its own, whose table replaces the one in ``results``."""
    parts = results["parts"]
    names = [n for n in ("baseline", "this") if any(n in v for v in parts.values())]
    label = {"baseline": f"before (`{(results.get('baseline') or '')[:7]}`)", "this": f"this tree (`{results['commit']}`)"}
    out = ["## Steady-state footprint", "",
           f"`{results['command']}` -- each part runs the code before these changes and this tree alternately, "
           "each with a fresh lean engine and recorder (CLI defaults). Sizes in MB of 2^20 bytes.", ""]
    if "disk" in parts:
        out += ["**Disk over a long run** (64 sessions, chain mode from 8k ids, conversations of up to 100 turns "
                "run back to back; bytes on disk = SQLite file + WAL + journal segments, logical = the indexed "
                "records' and blobs' content). Ratio = on disk ÷ logical.", "",
                "| t s | " + " | ".join(f"{label[n]} on disk (db / WAL / journal) | logical | ratio" for n in names) + " |",
                "|---|" + "---|---|---|" * len(names)]
        series = {n: parts["disk"][n]["samples"] for n in names}
        longest = max(len(v) for v in series.values())
        first = series[names[0]]
        step = max(1.0, (first[-1]["t"] - 20.0) / 14) if first else 1.0
        rows, last_t = [], -1e9  # every sample of the first 20 s (where fixed floors show), then ~15 rows
        for i, smp in enumerate(first):
            if smp["t"] <= 20.5 or smp["t"] - last_t >= step or i == len(first) - 1:
                rows.append(i)
                last_t = smp["t"]
        for i in rows or range(longest):
            row = [f"{series[names[0]][min(i, len(series[names[0]]) - 1)]['t']:.0f}"]
            for n in names:
                smp = series[n][min(i, len(series[n]) - 1)]
                row += [f"{(smp['db'] + smp['wal'] + smp['journal']) / MB:.1f} ({smp['db'] / MB:.1f} / {smp['wal'] / MB:.1f}"
                        f" / {smp['journal'] / MB:.1f})", f"{smp['logical'] / MB:.1f}", f"{_ratio(smp):.2f}×" if smp["logical"] else "– (nothing indexed)"]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        for n in names:
            d = parts["disk"][n]
            big = [_ratio(s) for s in d["samples"] if s["logical"] >= 16 * MB]
            anyr = [_ratio(s) for s in d["samples"] if s["logical"]]
            from1 = [_ratio(s) for s in d["samples"] if s["logical"] >= 1 * MB]
            over = [s for s in d["samples"] if s["logical"] and _ratio(s) > 3.0]
            a, ld = d["after_stop"], d["load"]
            out.append(f"- {label[n]}: {ld['calls']:,} calls, {ld.get('throughput', float('nan')):.0f} calls/s, "
                       f"p50 / p99 {ld.get('p50_ms', float('nan')):.0f} / {ld.get('p99_ms', float('nan')):.0f} ms; "
                       f"worst ratio {max(from1, default=float('nan')):.2f}× from the first sample with 1 MB indexed, "
                       f"{max(big, default=float('nan')):.2f}× once 16 MB are "
                       f"indexed ({max(anyr):.2f}× over every sample with anything indexed; {len(over)} of {len(d['samples'])} samples "
                       f"over 3×{', the last at ' + format(over[-1]['t'], '.0f') + ' s' if over else ''}); peak WAL "
                       f"{max(s['wal'] for s in d['samples']) / MB:.1f} MB, peak journal "
                       f"{max(s['journal'] for s in d['samples']) / MB:.1f} MB; after a clean stop "
                       f"{(a['db'] + a['wal'] + a['journal']) / MB:.1f} MB for {a['logical'] / MB:.1f} MB logical.")
        out.append("")
    if "sessions" in parts:
        out += ["**Memory per open session** (resident memory of the recorder and its index process, read "
                f"{3:.0f} s after each quarter of the sessions has made its calls; the sessions stay open).", "",
                "| version | first prompt ids | calls per session | RSS at 0 / 25 / 50 / 75 / 100 % of the sessions, MB | per open session |",
                "|---|---|---|---|---|"]
        for n in names:
            for smp in parts["sessions"].get(n, []):
                pts = " / ".join(f"{r / MB:.0f}" for _, r in smp["points"])
                out.append(f"| {label[n]} | {smp['prompt']:,} | {smp['turns']} | {pts} (n = "
                           f"{smp['points'][-1][0]:,}) | {smp['bytes_per_session'] / 1024:.0f} KB |")
        out.append("")
    if "read" in parts:
        out += ["**Memory after a large read** (one 100-turn session from 8k ids read back whole through "
                "`GET /admin/sessions/{id}/records`; RSS of recorder and index process before the read, then "
                "each second after it).", "", "| version | JSON | read s | RSS before → after, each second MB | last vs before |",
                "|---|---|---|---|---|"]
        for n in names:
            r = parts["read"][n]
            series_ = " ".join(f"{x / MB:.0f}" for x in r["rss_after"])
            out.append(f"| {label[n]} | {r['json_bytes'] / MB:.1f} MB ({r['records']} records, last prompt "
                       f"{r['final_prompt_ids']:,} ids) | {r['read_s']:.2f} | {r['rss_before'] / MB:.0f} → {series_} | "
                       f"{(r['rss_after'][-1] - r['rss_before']) / r['rss_before'] * 100:+.0f} % |")
        out.append("")
    if "chain" in parts:
        out += ["**One session's chain latency** (chain mode, one session, no think time; cells of both versions "
                "alternated; latency seen by the agent).", "",
                "| version | first prompt ids | cells: p50 / p99 ms (calls/s) |", "|---|---|---|"]
        for n in names:
            cells = parts["chain"].get(n, [])
            for prompt in sorted({c["prompt"] for c in cells}):
                out.append(f"| {label[n]} | {prompt:,} | " + "; ".join(
                    f"{c['p50_ms']:.2f} / {c['p99_ms']:.2f} ({c['throughput']:.0f})" for c in cells
                    if c["prompt"] == prompt) + " |")
        out.append("")
    if admin is not None:  # its own run (``--admin-listener``): its own command and commit
        out += admin_table(admin, own_command=True)
    elif "admin" in parts:
        out += admin_table(results)
    return "\n".join(out)


NOTES = procs.BENCH / "footprint_notes.md"
RESULTS = procs.BENCH / "results" / "footprint.json"
#: ``--parts admin --admin-listener --out`` this: the admin table comes from it when it exists
ADMIN_RESULTS = procs.BENCH / "results" / "footprint_admin.json"


def page_section(results_path: Path = RESULTS) -> str | None:
    """The section with its notes, or None when no footprint run was kept (``docs_page.py`` asks)."""
    if not results_path.exists():
        return None
    admin = orjson.loads(ADMIN_RESULTS.read_bytes()) if ADMIN_RESULTS.exists() else None
    section = render_section(orjson.loads(results_path.read_bytes()), admin)
    if NOTES.exists():
        section += "\n" + NOTES.read_text().strip() + "\n"
    return section


def write_docs(page: Path, section: str) -> None:
    """Put ``section`` in ``page``: in place of an earlier one, else before "## How to reproduce"."""
    text = page.read_text()
    head = "## Steady-state footprint"
    if head in text:
        start = text.index(head)
        end = text.find("\n## ", start + len(head))
        text = text[:start] + section.rstrip() + "\n" + (text[end:] if end >= 0 else "")
    else:
        at = text.index("## How to reproduce")
        text = text[:at] + section.rstrip() + "\n\n" + text[at:]
    page.write_text(text)


def _brief(part: str, v: Any) -> str:
    if part == "disk":
        worst = max((s["db"] + s["wal"] + s["journal"]) / s["logical"] for s in v["samples"] if s["logical"] > 16 * MB) \
            if any(s["logical"] > 16 * MB for s in v["samples"]) else float("nan")
        last = v["samples"][-1] if v["samples"] else {}
        return (f"calls={v['load']['calls']} logical_end={last.get('logical', 0) / MB:.0f} MB "
                f"worst_ratio(>16MB logical)={worst:.2f} peak_wal={max(s['wal'] for s in v['samples']) / MB:.0f} MB "
                f"peak_journal={max(s['journal'] for s in v['samples']) / MB:.0f} MB")
    if part == "read":
        return (f"{v['json_bytes'] / MB:.1f} MB JSON in {v['read_s']:.2f}s; rss {v['rss_before'] / MB:.0f} -> "
                + " ".join(f"{r / MB:.0f}" for r in v["rss_after"]) + " MB")
    if part == "admin":
        v = v[-1]
        return (f"create p50/p99 {v['create_p50_ms']:.2f}/{v['create_p99_ms']:.2f} ms, close {v['close_p50_ms']:.2f}/"
                f"{v['close_p99_ms']:.2f} ms ({v['probes']} probes); chat p50/p99 {v['load']['p50_ms']:.1f}/"
                f"{v['load']['p99_ms']:.1f} ms {v['load']['throughput']:.0f}/s")
    if part == "chain":
        return "; ".join(f"P={c['prompt']}: p50/p99 {c['p50_ms']:.2f}/{c['p99_ms']:.2f} ms" for c in v[-2:])
    if part == "sessions":
        return "; ".join(f"P={s['prompt']}: {s['bytes_per_session'] / 1024:.0f} KB/session "
                         f"({' '.join(f'{n}:{r / MB:.0f}' for n, r in s['points'])} MB)" for s in v)
    return ""


if __name__ == "__main__":
    main()
