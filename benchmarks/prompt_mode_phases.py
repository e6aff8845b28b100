"""Where a continued call's time goes: one-session rollouts of both prompt modes through a recorder
that logs its engine exchanges (``phase_hook.py``), medians per exchange and per gap between them.

    PYTHONPATH=$PWD python benchmarks/prompt_mode_phases.py ROUNDS LOGFILE [ENGINE ARGS...]   # docs/benchmarks.md
"""
import asyncio
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
import httpx
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests/recorder")
import bench_prompt_mode as b
from procs import recorder_proc, PYTHON
from agentloop import ADMIN
rounds = int(sys.argv[1]); log = sys.argv[2]; engine_args = sys.argv[3:]  # e.g. --generate-derender
os.environ["OEH_PHASE_LOG"] = log
open(log, "w").close()
with tempfile.TemporaryDirectory() as tmp:
    logs = Path(tmp)
    with b.engine_proc(logs, extra=engine_args) as engine:
        rp = recorder_proc(engine.url, logs / "r.db", ADMIN, logs)
        rp.argv = [PYTHON, str(Path(__file__).resolve().parent / "phase_hook.py"), *rp.argv[3:]]
        with rp as rec:
            asyncio.run(b._script(engine.url))
            async def go():
                res = defaultdict(list)
                async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(keepalive_expiry=2.0)) as http:
                    for i in range(rounds + 1):
                        for mode in (("full_history", "incremental") if i % 2 else ("incremental", "full_history")):
                            url, headers = await b._target(http, mode, engine.url, rec.url)
                            with open(log, "a") as f: f.write(f"M {mode} {i}\n")
                            t = []
                            await b._rollout(http, url, headers, t)
                            if i: res[mode] += t
                return res
            res = asyncio.run(go())
for m, t in res.items(): print(m, "client p50", round(statistics.median(t), 2))
# parse the log: per mode, per call: exchanges and totals
mode = None; cur = None; calls = defaultdict(list)
for line in open(log):
    p = line.split()
    if p[0] == "M":
        mode = p[1] if int(p[2]) else None; continue
    if mode is None: continue
    if p[0] == "x":
        if cur is None: cur = []
        cur.append((p[1], float(p[2])))
    elif p[0] == "s":
        strat = float(p[2])
    elif p[0] == "h":
        calls[mode].append((float(p[2]), strat, cur or [])); cur = None
for m, cs in calls.items():
    print(f"== {m}: {len(cs)} calls; handle_chat p50 {statistics.median(c[0] for c in cs):.2f} ms, strategy p50 {statistics.median(c[1] for c in cs):.2f}")
    by = defaultdict(list)
    for h, s, xs in cs:
        if m == "incremental" and len(xs) < 4: continue  # a chain start (full history)
        for path, ms in xs: by[path].append(ms)
        by["(handle - strategy)"].append(h - s)
        by["(strategy - exchanges, renders overlapped)"].append(s - sum(ms for path, ms in xs if not path.endswith("/render")) - max((ms for path, ms in xs if path.endswith("/render")), default=0))
    for k, v in by.items(): print(f"   {k:45s} n={len(v):4d} p50={statistics.median(v):.3f} ms")
# gaps inside incremental continued calls
mode = None; cur = []; gaps = defaultdict(list)
for line in open(log):
    p = line.split()
    if p[0] == "M":
        mode = p[1] if int(p[2]) else None; cur = []; continue
    if mode != "incremental": continue
    if p[0] == "x": cur.append((p[1], float(p[3]), float(p[2]) / 1000))
    elif p[0] == "s":
        s0, sd = float(p[3]), float(p[2]) / 1000
        xs = cur; cur = []
        if len(xs) not in (3, 4): continue  # two renders, generate, and derender unless generate parsed (one step)
        r = [x for x in xs if x[0].endswith("/render")]; g = [x for x in xs if "generate" in x[0] or x[0] == "/v1/completions"][0]
        d = ([x for x in xs if "derender" in x[0]] or [None])[0]
        first = min(x[1] for x in r); rend = max(x[1] + x[2] for x in r)
        gaps["start -> first render sent"].append(first - s0)
        gaps["renders (first sent -> last answered)"].append(rend - first)
        gaps["last render answered -> generate sent"].append(g[1] - rend)
        gaps["generate"].append(g[2])
        if d is None:
            gaps["generate answered -> strategy done"].append(s0 + sd - (g[1] + g[2]))
            continue
        gaps["generate answered -> derender sent"].append(d[1] - (g[1] + g[2]))
        gaps["derender"].append(d[2])
        gaps["derender answered -> strategy done"].append(s0 + sd - (d[1] + d[2]))
for k, v in gaps.items(): print(f"   {k:45s} n={len(v):4d} p50={statistics.median(v)*1000:.3f} ms")
