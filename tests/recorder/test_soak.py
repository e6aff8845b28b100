"""A bounded soak: rounds of sessions against the recorder's CLI must not grow its disk or memory
without bound.

Each round opens sessions whose prompts grow with their history, runs them, reads one back through
the admin API (a large read) and closes them; after each round the store's bytes on disk and the
recorder's resident memory (its index process included) are read. No timing is asserted: only
that what the store holds beyond its content stays under a cap that does not grow with the run
(the run writes several times that cap, so an unbounded WAL or journal fails it), that it is never
more than 3x the content once a MB is stored (bounds fixed at their long-run sizes fail that in the
first rounds: ``store/disk_budget.py``), and that memory grows no faster in the second half than in
the first, with room for noise.
"""

from __future__ import annotations

import contextlib

import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder.serving import free_port
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_process import child_pids

from agentloop import ADMIN, TOOLS, tool_script
from test_durability import start_recorder

MB = 1 << 20
ROUNDS, SESSIONS, TURNS = 12, 8, 14  # the reference engine's context is 32k ids: turn 14 is ~25k
TOOL_TEXT = "".join(f"line {i}: value={i * 7919 % 100003}\n" for i in range(200))  # ~4.5 KB a tool result
#: What the store may hold beyond its content at any moment, whatever the run's length: the WAL's
#: bound (8 MB) and the journal's open segment (4 MB) plus the indexer's backlog, with room to spare.
OVERHEAD_CAP = 32 * MB
#: The issue's target: bytes on disk at most this many times the content, from 1 MB of content on
#: (below it SQLite's own pages and the bounds' floors, about 2.5 MB, decide).
RATIO_CAP, RATIO_FROM = 3.0, 1 * MB


def _tree_rss(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            todo.extend(child_pids(p))
        except FileNotFoundError:
            continue
    return total


def _disk(db: Path) -> int:
    """Bytes on disk: the database, its WAL and the journal's segments. The recorder deletes a segment once
    it is indexed, which may fall between the listing and a file's stat: a file gone by then holds nothing."""
    total = 0
    for path in [db, db.with_name(db.name + "-wal"), *db.with_name(db.name + ".records-log").glob("records-*.log")]:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def _logical(db: Path) -> tuple[int, int]:
    """(bytes of record and blob content, bytes of every record's whole prompt as the journal wrote it)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        records = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(COALESCE(prompt_tail, x'')) + LENGTH(COALESCE(msgs, x''))"
            " + LENGTH(COALESCE(completion_ids, x'')) + LENGTH(COALESCE(logprobs, x'')) + LENGTH(request)"
            " + LENGTH(response) + LENGTH(metadata)), 0), COALESCE(SUM(prompt_len) * 4, 0) FROM records").fetchone()
        blobs = conn.execute("SELECT COALESCE(SUM(LENGTH(data) + LENGTH(hash)), 0) FROM blobs").fetchone()[0]
    finally:
        conn.close()
    return int(records[0]) + int(blobs), int(records[1])


def _agent(base: str, s: dict, errors: list[str]) -> None:
    messages: list[dict] = [{"role": "system", "content": "You are a careful coding agent. " * 200},
                            {"role": "user", "content": "fix the tests"}]
    with httpx.Client(timeout=120) as client:
        for _ in range(TURNS):
            r = client.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                            json={"model": "reference-model", "messages": messages, "tools": TOOLS})
            if r.status_code != 200:
                errors.append(f"{r.status_code}: {r.text[:200]}")
                return
            msg = r.json()["choices"][0]["message"]
            messages += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": TOOL_TEXT}]


@pytest.mark.slow  # a soak: rounds of concurrent sessions through a recorder process (~15 s)
def test_disk_and_memory_stay_bounded_over_rounds_of_sessions(tmp_path: Path, engine: EngineServer) -> None:
    db = tmp_path / "records.db"
    port = free_port()
    proc = start_recorder(db, engine.url, port)
    base = f"http://127.0.0.1:{port}"
    admin = {"authorization": f"Bearer {ADMIN}"}
    samples: list[tuple[int, int, int, int]] = []  # (disk, logical, journalled prompts, rss)
    errors: list[str] = []
    try:
        with httpx.Client(base_url=base, headers=admin, timeout=300) as http:
            for _ in range(ROUNDS):
                sessions = [http.post("/admin/sessions", json={}).json() for _ in range(SESSIONS)]
                for s in sessions:
                    engine.set_script(s["session_id"], tool_script(200))
                agents = [threading.Thread(target=_agent, args=(base, s, errors)) for s in sessions]
                for t in agents:
                    t.start()
                for t in agents:
                    t.join()
                assert not errors, errors[:3]
                read = http.get(f"/admin/sessions/{sessions[0]['session_id']}/records")
                assert read.status_code == 200 and len(read.json()) == TURNS
                for s in sessions:
                    assert http.post(f"/admin/sessions/{s['session_id']}/close").status_code == 200
                disk, (logical, journalled) = _disk(db), _logical(db)
                samples.append((disk, logical, journalled, _tree_rss(proc.pid)))
    finally:
        proc.terminate()
        proc.wait(30)

    written = samples[-1][2]
    assert written > 2 * OVERHEAD_CAP, f"the run wrote only {written} bytes of prompts: it could not fail"
    overheads = [disk - logical for disk, logical, _, _ in samples]
    assert max(overheads) < OVERHEAD_CAP, f"bytes on disk beyond the content, per round: {overheads}, wrote {written}"
    ratios = [round(disk / logical, 2) for disk, logical, _, _ in samples if logical >= RATIO_FROM]
    assert ratios and max(ratios) <= RATIO_CAP, f"bytes on disk / content, per round: {ratios}"
    rss = [r for *_, r in samples]
    half = ROUNDS // 2
    early, late = rss[half - 1] - rss[0], rss[-1] - rss[half - 1]
    # a leak grows both halves alike; warm-up and allocator noise land mostly in the first
    assert late <= 0.75 * max(early, 0) + 24 * MB, f"resident memory per round (MB): {[r // MB for r in rss]}"
