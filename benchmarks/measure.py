"""One benchmark cell: fresh processes, a discarded pre-warm, a measured load run, its resource use.

A cell is (setting, target). Every cell starts a fresh lean engine and, for the recorder and
capture targets, a fresh proxy process with an empty store, so no cell inherits another's state.
CPU is ``utime+stime`` from ``/proc`` over the measured run only (pre-warm excluded); RSS is read
after the pre-warm and at the end; store bytes are the SQLite file's logical content after the
recorder has stopped (so the WAL is checkpointed and nothing is in flight).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

import procs

#: Idle time before a long session's settled RSS is read (longer than the heap trimmer's period).
SETTLE_S = 2.5
PREWARM = ["--sessions", "4", "--turns", "3", "--max-conversations", "4", "--duration", "30"]


@dataclass(frozen=True)
class Setting:
    mode: str  # fixed | chain
    prompt_tokens: int
    sessions: int
    turns: int = 20
    stream: bool = False

    @property
    def label(self) -> str:
        s = f"{self.mode} P={self.prompt_tokens // 1024}k N={self.sessions}"
        if self.turns != 20:
            s += f" T={self.turns}"
        return s + (" stream" if self.stream else "")

    @classmethod
    def parse(cls, text: str) -> Setting:
        """``mode:prompt_tokens:sessions[:turns][:stream]``, e.g. ``chain:8192:16`` or ``chain:8192:16:20:stream``."""
        parts = text.split(":")
        if len(parts) < 3 or parts[0] not in ("fixed", "chain"):
            raise ValueError(f"bad setting {text!r}: want mode:prompt_tokens:sessions[:turns][:stream]")
        turns = int(parts[3]) if len(parts) > 3 and parts[3] else 20
        return cls(parts[0], int(parts[1]), int(parts[2]), turns, stream=len(parts) > 4 and parts[4] == "stream")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds: the main (event-loop) thread, all other threads, and child processes (the
    recorder's index process)."""
    main, other = 0.0, 0.0
    children = procs.tree_cpu_seconds(pid) - procs.cpu_seconds(pid)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if int(tid) == pid:
            main += cpu
        else:
            other += cpu
    return {"main": main, "other": other, "children": children}


def _table_bytes(conn: sqlite3.Connection, table: str) -> tuple[int, int]:
    """(rows, logical bytes) of a table: BLOB/TEXT column lengths plus 8 bytes per numeric column.

    Schema-agnostic on purpose: the store's layout may change, its cost should stay comparable.
    """
    cols = conn.execute(f"PRAGMA table_info({table})").fetchall()
    terms = [f"LENGTH(COALESCE({c[1]}, x''))" if (c[2] or "").upper() in ("BLOB", "TEXT", "") else "8" for c in cols]
    rows, size = conn.execute(f"SELECT COUNT(*), COALESCE(SUM({' + '.join(terms)}), 0) FROM {table}").fetchone()
    return int(rows), int(size)


def store_bytes(db_path: Path) -> dict[str, int]:
    """Logical bytes in the store (records and blobs) and the file size, read with plain sqlite3."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        records, record_bytes = _table_bytes(conn, "records")
        blobs, blob_bytes = _table_bytes(conn, "blobs")
    finally:
        conn.close()
    return {"records": records, "record_bytes": record_bytes, "blobs": blobs, "blob_bytes": blob_bytes,
            "logical_bytes": record_bytes + blob_bytes, "file_bytes": sum(
                p.stat().st_size for p in (db_path, db_path.with_name(db_path.name + "-wal")) if p.exists())}


def _loadgen(url: str, target: str, setting: Setting, admin: str | None, extra: list[str]) -> list[str]:
    argv = [procs.PYTHON, str(procs.BENCH / "loadgen.py"), "--url", url, "--target", target,
            "--prompt-tokens", str(setting.prompt_tokens), "--turns", str(setting.turns)]
    if admin:
        argv.append(f"--admin-token={admin}")
    if setting.stream:
        argv.append("--stream")
    return argv + extra


def _proxy(target: str, engine_url: str, store: Path, admin: str, logs: Path,
           tree: Path | None = None) -> procs.Proc | None:
    if target in ("recorder", "baseline"):
        proc = procs.recorder_proc(engine_url, store, admin, logs)
        if target == "baseline":  # the same recorder CLI, run from another checkout (``compare_trees.py``)
            if tree is None:
                raise ValueError("the baseline target needs the baseline's tree")
            proc.cwd = tree
        return proc
    if target == "capture":
        return procs.capture_proc(engine_url, logs)
    if target == "floor":
        return procs.floor_proc(engine_url, store.with_suffix(".floor"), logs)
    return None


def run_cell(setting: Setting, target: str, *, duration: float, logs: Path, rep: int = 1,
             long_session: bool = False, tree: Path | None = None, sample_s: float = 0.0) -> dict[str, Any]:
    """Measure one (setting, target). ``long_session``: one conversation, per-call rows, records read back.
    ``target`` ``baseline`` is the recorder of another checkout, ``tree``, driven as the recorder is.
    ``sample_s`` > 0: the proxy's resident memory (with its children) and the store directory's bytes
    on disk are read that often during the measured load (``result["samples"]``: seconds, RSS, disk)."""
    recorder = target in ("recorder", "baseline")
    load_target = "recorder" if recorder else target
    admin = secrets.token_hex(24)
    result: dict[str, Any] = {"setting": asdict(setting), "label": setting.label, "target": target, "rep": rep,
                              "started_at": time.time(), "loadavg_before": procs.loadavg(),
                              "code_before": procs.code_fingerprint()}
    with tempfile.TemporaryDirectory(prefix="oeh-bench-") as tmp:
        store = Path(tmp) / "store.db"
        with procs.engine_proc(setting.mode, setting.prompt_tokens, logs) as engine:
            proxy = _proxy(target, engine.url, store, admin, logs, tree)
            t0 = time.perf_counter()
            if proxy is not None:
                proxy.start(timeout_s=120)
            result["startup_s"] = time.perf_counter() - t0
            try:
                url = proxy.url if proxy is not None else engine.url
                server = proxy if proxy is not None else engine
                # the long session too: its memory growth is then the session's, not first-call warm-up
                procs.run_json(_loadgen(url, load_target, setting, admin, PREWARM), 300)
                rss0, cpu0 = procs.tree_rss_bytes(server.pid), procs.tree_cpu_seconds(server.pid)
                eng0 = procs.cpu_seconds(engine.pid)
                threads0 = thread_cpu(server.pid)
                sys0, wall0 = procs.system_busy_seconds(), time.perf_counter()
                extra = ["--sessions", str(setting.sessions), "--duration", str(duration)]
                if long_session:
                    # exactly one conversation: the deadline only has to be far away
                    extra = ["--sessions", "1", "--max-conversations", "1", "--duration", "1e9", "--keep-calls"]
                with _Sampler(server.pid, Path(tmp), sample_s) as sampler:
                    load = procs.run_json(_loadgen(url, load_target, setting, admin, extra), duration + 900)
                if sample_s > 0:
                    result["samples"] = sampler.rows
                calls = max(1, load["calls"])
                rss1, cpu1 = procs.tree_rss_bytes(server.pid), procs.tree_cpu_seconds(server.pid)
                eng1 = procs.cpu_seconds(engine.pid)
                threads1 = thread_cpu(server.pid)
                if long_session:
                    # what stays held once the last call's buffers are freed and handed back (the
                    # recorder's heap trimmer runs every second): growth with history, not working set
                    time.sleep(SETTLE_S)
                    result["rss_settled"] = procs.tree_rss_bytes(server.pid)
                wall = time.perf_counter() - wall0
                ours = (cpu1 - cpu0) + ((eng1 - eng0) if server is not engine else 0.0)
                ours += (load.get("lg_cpu_ms_per_call") or 0.0) * load["calls"] / 1000.0
                result["background_cores"] = max(0.0, (procs.system_busy_seconds() - sys0 - ours) / wall)
                result["load"] = {k: v for k, v in load.items() if k != "session_ids"}
                result["server"] = {
                    "rss_start": rss0, "rss_end": rss1,
                    "cpu_ms_per_call": (cpu1 - cpu0) * 1000.0 / calls,
                    "main_thread_cpu_ms_per_call": (threads1["main"] - threads0["main"]) * 1000.0 / calls,
                    "other_threads_cpu_ms_per_call": (threads1["other"] - threads0["other"]) * 1000.0 / calls,
                    "child_processes_cpu_ms_per_call": (threads1["children"] - threads0["children"]) * 1000.0 / calls,
                    "engine_cpu_ms_per_call": (eng1 - eng0) * 1000.0 / calls,
                }
                if long_session and recorder and load["session_ids"]:
                    result["readback"] = _read_back(url, admin, load["session_ids"][0])
            finally:
                if proxy is not None:
                    result["proxy_exit"] = proxy.stop()
        if recorder:
            result["store"] = store_bytes(store)
            if long_session and load.get("session_ids"):
                result["store"]["session"] = _session_bytes(store, load["session_ids"][0])
    result["loadavg_after"] = procs.loadavg()
    result["code_after"] = procs.code_fingerprint()
    return result


def disk_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` take on disk (allocated blocks, not apparent sizes)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            st = path.stat()
        except FileNotFoundError:  # a journal segment deleted meanwhile
            continue
        if path.is_file():
            total += st.st_blocks * 512
    return total


class _Sampler:
    """Reads a process tree's RSS and a folder's disk bytes every ``every_s`` seconds on a thread."""

    def __init__(self, pid: int, folder: Path, every_s: float) -> None:
        self.pid, self.folder, self.every_s = pid, folder, every_s
        self.rows: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        self._t0 = time.perf_counter()
        if self.every_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.every_s > 0:
            self._stop.set()
            self._thread.join()
            self._read(time.perf_counter() - self._t0)

    def _read(self, at: float) -> None:
        try:
            self.rows.append((round(at, 2), procs.tree_rss_bytes(self.pid), disk_bytes(self.folder)))
        except (FileNotFoundError, RuntimeError):
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._read(time.perf_counter() - self._t0)


def _session_bytes(store: Path, session_id: str) -> dict[str, int]:
    from openenv_harness.recorder.store.sqlite import SQLiteStore

    return SQLiteStore(store).session_bytes(session_id)


def _read_back(url: str, admin: str, session_id: str) -> dict[str, Any]:
    """Read a session's records back through the admin API and check their chain classification."""
    req = urllib.request.Request(f"{url}/admin/sessions/{session_id}/records?format=json",
                                 headers={"authorization": f"Bearer {admin}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read()
    seconds = time.perf_counter() - t0
    entries = orjson.loads(raw)
    classes: dict[str, int] = {}
    for e in entries:
        fid = (e["metadata"].get("fidelity") or {}).get("class", "none")
        classes[fid] = classes.get(fid, 0) + 1
    last = entries[-1] if entries else {}
    return {"records": len(entries), "seconds": seconds, "json_bytes": len(raw), "fidelity": classes,
            "final_prompt_ids": len(last.get("prompt_token_ids", [])),
            "final_completion_ids": len(last.get("completion_token_ids", [])),
            "all_ok": all(e["metadata"].get("status") == "ok" for e in entries)}
