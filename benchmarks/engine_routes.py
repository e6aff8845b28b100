"""The reference engine's routes alone: engine CPU per request for this tree's engine process and
another tree's, alternated (the routes a continued incremental call waits on, and the chat route).

    PYTHONPATH=$PWD python benchmarks/engine_routes.py REQUESTS OTHER_TREE   # docs/benchmarks.md
"""
import sys, tempfile, time, statistics
from pathlib import Path
import httpx
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests/recorder")
import bench_prompt_mode as b
from procs import cpu_seconds
from agentloop import TOOLS
from openenv_harness.testing.engine import agent_echo
from openenv_harness.recorder.prompt_modes.sample_parse import derender_chat_request
N = int(sys.argv[1]); trees = [None, Path(sys.argv[2])]
import asyncio
def bodies(url):
    c = httpx.Client(base_url=url, timeout=30)
    msgs = [{"role": "system", "content": "You are a careful coding agent."}, {"role": "user", "content": "Do the task step by step."}]
    for _ in range(6):
        r = c.post("/v1/chat/completions", json={"model": "reference-model", "messages": msgs, "tools": TOOLS, "max_tokens": 512}).json()
        m = r["choices"][0]["message"]; msgs = msgs + [agent_echo(m, "pi")] + [{"role": "tool", "tool_call_id": t["id"], "content": "ran\n"} for t in m["tool_calls"]]
    chat = {"model": "reference-model", "messages": msgs, "tools": TOOLS, "max_tokens": 512, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
    rd = c.post("/v1/chat/completions/render", json=chat).json()
    gen = {"token_ids": rd["token_ids"], "sampling_params": rd["sampling_params"], "model": "reference-model"}
    g = c.post("/inference/v1/generate", json=gen).json()
    der = {"generate_response": g, "prompt_token_ids": rd["token_ids"][-64:], "prompt_tokens": len(rd["token_ids"]), "chat_request": derender_chat_request(chat)}
    return {"chat": ("/v1/chat/completions", chat), "render": ("/v1/chat/completions/render", chat), "generate": ("/inference/v1/generate", gen), "derender": ("/v1/chat/completions/derender", der)}
res = {}
with tempfile.TemporaryDirectory() as tmp:
    import contextlib
    with contextlib.ExitStack() as st:
        engines = {("mine" if t is None else "base"): st.enter_context(b.engine_proc(Path(tmp), cwd=t)) for t in trees}
        for e in engines.values(): asyncio.run(b._script(e.url))
        bs = {k: bodies(e.url) for k, e in engines.items()}
        for rnd in range(4):
            for k in (("mine", "base") if rnd % 2 else ("base", "mine")):
                e = engines[k]
                with httpx.Client(base_url=e.url, timeout=30) as c:
                    for route, (path, body) in bs[k].items():
                        walls = []
                        c0 = cpu_seconds(e.pid)
                        for _ in range(N):
                            t = time.perf_counter(); r = c.post(path, json=body); walls.append(time.perf_counter() - t)
                            assert r.status_code == 200, r.text
                        res.setdefault((k, route), [[], []]); res[(k, route)][0].append((cpu_seconds(e.pid) - c0) / N); res[(k, route)][1] += walls
for (k, route), (cpus, walls) in sorted(res.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"{route:9s} {k:4s} engine cpu/request {statistics.mean(cpus)*1000:.3f} ms  client wall p50 {statistics.median(walls)*1000:.3f} ms")
