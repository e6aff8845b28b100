"""Where the recorder's CPU goes: py-spy samples of a recorder process under the benchmark load.

Why: a missed target is only actionable with the functions that cost the time. This starts a lean
engine and a recorder, samples the recorder with ``py-spy record --format raw --threads`` while
the load generator runs, and folds the stacks into (a) the share of samples per thread, (b) named
categories in priority order (one category per sample), (c) the top self frames, (d) the
recorder functions by inclusive share.

    python benchmarks/profile_recorder.py --mode chain --prompt-tokens 8192 --sessions 64 --duration 10

``py-spy`` must be installed (``pip install py-spy``) and allowed to ptrace the recorder.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import procs

def _writer_wait_frame() -> str:
    """A thread indexer's blocking ``queue.get()`` as py-spy names it (its line moves as the code changes)."""
    try:
        from openenv_harness.recorder.store import indexer

        lines = Path(indexer.__file__).read_text().splitlines()
        number = next(i for i, line in enumerate(lines, 1) if "item = self._queue.get()" in line)
    except (ImportError, OSError, StopIteration):
        return "ThreadIndexer._run (blocking get not found)"
    return f"ThreadIndexer._run (openenv_harness/recorder/store/indexer.py:{number})"  # leaf frame


#: Leaf frames that mean "waiting", which py-spy's idle filter lets through here: left out of shares.
#: ``Runner.run`` as the leaf is uvloop's C loop with no Python frame above it; a ``--native``
#: profile of the recorder showed those samples are ~85 % ``epoll_pwait``.
IDLE_FRAMES = ("Runner.run (asyncio/runners.py", _writer_wait_frame(), "Condition.wait (threading.py",
               "epoll_wait", "epoll_pwait", "_worker (concurrent/futures/thread.py", "SimpleQueue.get",
               "_recv (multiprocessing/connection.py", "_poll (multiprocessing/connection.py",
               "wait (multiprocessing/connection.py", "select (selectors.py")

#: (frame substring, category). Stacks are walked from the innermost frame outwards and the first
#: frame matching a rule names the sample's category, so C work done "inside" a Python line (orjson,
#: sqlite3, zstd) is charged to the Python function that called it.
FRAME_RULES: list[tuple[str, str]] = [
    ("pack_blob (openenv_harness/recorder/store/blocks.py", "store writer: zstd compression of blobs"),
    ("prompt_delta (openenv_harness/recorder/store/prompt_sketch.py", "store writer: prompt/message deltas"),
    ("hash_delta (openenv_harness/recorder/store/deltas.py", "store writer: prompt/message deltas"),
    ("digest (openenv_harness/recorder/store/blocks.py", "store writer: sha256 message hashing"),
    ("message_blobs (openenv_harness/recorder/store/blocks.py", "store writer: orjson.dumps per message"),
    ("_op_append (openenv_harness/recorder/store/index_ops.py", "store writer: INSERT + orjson.dumps of request/response/metadata"),
    ("put_blobs (openenv_harness/recorder/store/index_ops.py", "store writer: INSERT OR IGNORE of blobs"),
    ("_op_put_session (openenv_harness/recorder/store/index_ops.py", "store writer: session rows"),
    ("run_batch (openenv_harness/recorder/store/index_ops.py", "store writer: BEGIN/COMMIT"),
    ("ThreadIndexer._run (openenv_harness/recorder/store/indexer.py", "store writer: queue hand-off"),
    ("serve (openenv_harness/recorder/store/index_child.py", "store writer: journal read + decode, acks"),
    ("ProcessIndexer", "store: index process hand-off (send, acks)"),
    ("_submit (openenv_harness/recorder/store/journal_queue.py", "flow.record: store hand-off (queue put, future)"),
    ("HTTPEngine.chat (openenv_harness/recorder/upstream/http.py", "upstream: orjson.dumps of the engine body"),
    ("H1Engine.chat (openenv_harness/recorder/upstream/h1_engine.py", "upstream: orjson.dumps of the engine body"),
    ("parse_chat_reply (openenv_harness/recorder/upstream/reply_parse.py", "upstream: reply parse (ids span + orjson)"),
    ("parse_json_object (openenv_harness/recorder/upstream/reply_parse.py", "upstream: reply parse (ids span + orjson)"),
    ("split_chat_reply (openenv_harness/recorder/upstream/reply_parse.py", "upstream: reply parse (ids span + orjson)"),
    ("PromptIdsReader", "flow: prompt ids (only what the previous prompt lacks)"),
    ("read_ids (openenv_harness/recorder/upstream/reply_parse.py", "flow: prompt ids (only what the previous prompt lacks)"),
    ("openenv_harness/recorder/upstream/h1_engine.py", "upstream: engine client (httptools)"),
    ("httptools/", "upstream: engine client (httptools)"),
    ("HTTPEngine._send (openenv_harness/recorder/upstream/http.py", "upstream: orjson.loads of the engine reply + headers dict"),
    ("aiohttp/", "upstream: aiohttp client"),
    ("multidict/", "upstream: aiohttp client"),
    ("yarl/", "upstream: aiohttp client"),
    ("httpx/", "upstream: httpx client"),
    ("httpcore/", "upstream: httpcore connection pool / h11"),
    ("h11/", "upstream: httpcore connection pool / h11"),
    ("anyio/", "upstream: anyio socket stream (httpcore's backend)"),
    ("FidelityTracker.observe", "flow.record: fidelity classification"),
    ("agent_view (openenv_harness/recorder/validate.py", "flow.record/reply: agent_view copies"),
    ("extract_evidence (openenv_harness/recorder/validate.py", "flow.validate: extract_evidence (ids to arrays)"),
    ("_ids (openenv_harness/recorder/validate.py", "flow.validate: extract_evidence (ids to arrays)"),
    ("call_provenance", "flow.record: metadata and provenance dicts"),
    ("base_metadata", "flow.record: metadata and provenance dicts"),
    ("served_metadata (openenv_harness/recorder/call/pending.py", "flow.record: metadata and provenance dicts"),
    ("BudgetLedger.limits", "flow.record: metadata and provenance dicts"),
    ("synthesize_sse", "flow.reply: orjson.dumps / SSE synthesis"),
    ("render (openenv_harness/recorder/dialects/chat.py", "flow.reply: orjson.dumps / SSE synthesis"),
    ("enter (openenv_harness/recorder/dialects/chat.py", "flow.parse: orjson.loads + sha256 of the body"),
    ("parse (openenv_harness/recorder/call/admit.py", "flow.parse: orjson.loads + sha256 of the body"),
    ("upstream_body (openenv_harness/recorder/call/forward.py", "flow.forward: upstream body copy"),
    ("secret_digest", "auth: secret digest"),
    ("authenticate (openenv_harness/recorder/call/admit.py", "auth: secret digest"),
    ("prometheus_client/", "metrics (prometheus_client)"),
    ("openenv_harness/recorder/admin/", "admin API: session create/close"),
    ("SessionRegistry", "admin API: session create/close"),
    ("pydantic", "admin API: session create/close"),
    ("openenv_harness/recorder/edge/agent_protocol.py", "agent route: request parse, body read, reply write"),
    ("openenv_harness/recorder/edge/request_body.py", "agent route: request parse, body read, reply write"),
    ("openenv_harness/recorder/edge/request_limits.py", "agent route: request parse, body read, reply write"),
    ("_agent_headers (openenv_harness/recorder/app.py", "agent route: request parse, body read, reply write"),
    ("openenv_harness/recorder/", "flow: other recorder code"),
    ("fastapi/", "fastapi/starlette middleware and routing"),
    ("starlette/", "fastapi/starlette middleware and routing"),
    ("uvicorn/", "uvicorn/httptools server"),
    ("asyncio/", "asyncio/uvloop event loop (incl. C-level I/O)"),
]


def is_idle(frames: list[str]) -> bool:
    return any(marker in frames[-1] for marker in IDLE_FRAMES)


def categorize(frames: list[str]) -> str:
    for frame in reversed(frames):
        for needle, name in FRAME_RULES:
            if needle in frame:
                return name
    return "other (GC, no Python frame, misc)"


def summarize(raw: Path, top: int = 15) -> str:
    """Fold py-spy's raw (collapsed) output into a short text report."""
    samples: list[tuple[str, int]] = []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack, int(count)))
    idle = sum(c for stack, c in samples if is_idle(stack.split(";")))
    samples = [(stack, c) for stack, c in samples if not is_idle(stack.split(";"))]
    total = sum(c for _, c in samples)
    if not total:
        return "no samples"
    threads: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    selfs: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in samples:
        frames = stack.split(";")
        child = any(f.startswith("process ") and "index_child" in f for f in frames)
        frames = [f for f in frames if not f.startswith("process ")]  # --subprocesses prefixes each process
        threads["index process" if child else "store writer thread" if "oeh-store-writer" in frames[0] else
                 "event-loop thread" if "MainThread" in frames[0] else frames[0].split(":")[-1].strip()] += count
        cats[categorize(frames)] += count
        selfs[frames[-1]] += count
        seen = {f for f in frames if "openenv_harness/recorder/" in f}
        for f in seen:
            inclusive[f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].replace("openenv_harness/", "") + ")"] += count
    lines = [f"samples: {total} busy (+{idle} waiting, left out)", "by thread:"]
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in threads.most_common()]
    lines.append("by category (one per sample, first matching rule):")
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in cats.most_common()]
    lines.append(f"top {top} self frames:")
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in selfs.most_common(top)]
    lines.append(f"top {top} recorder functions (inclusive):")
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in inclusive.most_common(top)]
    return "\n".join(lines)


def profile(mode: str, prompt_tokens: int, sessions: int, duration: float, out_dir: Path, rate: int = 100) -> dict:
    """Run engine + recorder + load, sampling the recorder; returns the load result and the summary."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    token = secrets.token_hex(24)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"profile-{mode}-{prompt_tokens}-n{sessions}.txt"
    with tempfile.TemporaryDirectory(prefix="oeh-prof-") as tmp, procs.engine_proc(mode, prompt_tokens, out_dir) as eng:
        with procs.recorder_proc(eng.url, Path(tmp) / "store.db", token, out_dir) as rec:
            lg = [procs.PYTHON, str(procs.BENCH / "loadgen.py"), "--url", rec.url, "--target", "recorder",
                  f"--admin-token={token}", "--prompt-tokens", str(prompt_tokens), "--turns", "20"]
            procs.run_json(lg + ["--sessions", "4", "--turns", "3", "--max-conversations", "4", "--duration", "5"], 120)
            sampler = subprocess.Popen(
                [spy, "record", "--pid", str(rec.pid), "--rate", str(rate), "--format", "raw", "--threads", "--subprocesses",
                 "--nonblocking", "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            try:
                result = procs.run_json(lg + ["--sessions", str(sessions), "--duration", str(duration)], duration + 300)
            finally:
                sampler.send_signal(2)  # SIGINT: py-spy writes its output and exits
                sampler.wait(timeout=30)
    result.pop("session_ids", None)
    return {"load": result, "summary": summarize(raw), "raw": str(raw)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Profile the recorder under benchmark load with py-spy")
    p.add_argument("--mode", choices=("chain", "fixed"), default="chain")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "oeh-bench-profile")
    p.add_argument("--summarize", type=Path, default=None, help="only fold an existing raw py-spy file")
    a = p.parse_args(argv)
    if a.summarize:
        print(summarize(a.summarize))
        return
    got = profile(a.mode, a.prompt_tokens, a.sessions, a.duration, a.out_dir)
    load = got["load"]
    print(f"load: {load['calls']} calls, {load['throughput']:.0f} calls/s, p50 {load['p50_ms']:.2f} ms, "
          f"p99 {load['p99_ms']:.2f} ms, errors {load['errors']}")
    print(got["summary"])
    print(f"raw stacks: {got['raw']}")


if __name__ == "__main__":
    main()
