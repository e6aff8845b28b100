"""Commands inside an emulated sandbox: streamed ``exec`` and tracked background processes.

Both really run: ``/bin/sh -c`` (or the argv) as a local process in its own process group, so a
relay or an agent started through the real client really listens, and killing it really kills
everything it started. Background output is discarded, as the real server does.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openenv_harness.testing.hf_emulator.wire import LAST_CHUNK, HttpFailure, chunk, chunked_head

_READ_SIZE = 65536
_DRAIN_AFTER_EXIT_S = 0.5


def command_argv(cmd: Any, shell: Any) -> list[str]:
    """The argv for an exec/process payload, with the real server's validation."""
    if shell is True and not isinstance(cmd, str):
        raise HttpFailure(400, "shell=true requires cmd to be a string")
    if shell is False and not isinstance(cmd, list):
        raise HttpFailure(400, "shell=false requires cmd to be an argv list")
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, list) and cmd and all(isinstance(part, str) for part in cmd):
        return list(cmd)
    raise HttpFailure(400, "cmd must be a string or a non-empty list of strings")


def _kill_group(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class BackgroundEntry:
    """One process started with ``POST .../processes``."""

    id: str
    cmd: Any
    tag: str | None
    started_at_ms: int
    process: asyncio.subprocess.Process
    exit_code: int | None = None
    running: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id, "pid": self.process.pid, "cmd": self.cmd, "tag": self.tag,
            "started_at_ms": self.started_at_ms, "running": self.running, "exit_code": self.exit_code,
        }


class ProcessTable:
    """The processes of one sandbox."""

    def __init__(self) -> None:
        self.background: dict[str, BackgroundEntry] = {}
        self._foreground: set[asyncio.subprocess.Process] = set()

    async def start_background(
        self, argv: list[str], *, env: dict[str, str], cwd: Path, cmd: Any, tag: str | None
    ) -> BackgroundEntry:
        process = await _spawn(argv, env=env, cwd=cwd, stdin=None, capture=False)
        entry = BackgroundEntry(f"proc-{secrets.token_hex(6)}", cmd, tag, int(time.time() * 1000), process)
        self.background[entry.id] = entry
        asyncio.get_running_loop().create_task(self._reap(entry))
        return entry

    async def _reap(self, entry: BackgroundEntry) -> None:
        code = await entry.process.wait()
        entry.exit_code = code if code >= 0 else None
        entry.running = False

    def kill(self, process_id: str) -> bool:
        entry = self.background.get(process_id)
        if entry is None:
            raise HttpFailure(404, f"no process {process_id}")
        if not entry.running:
            return False
        _kill_group(entry.process)
        return True

    def kill_all(self) -> None:
        for entry in self.background.values():
            if entry.running:
                _kill_group(entry.process)
        for process in list(self._foreground):
            _kill_group(process)

    async def exec_stream(
        self,
        writer: asyncio.StreamWriter,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        timeout_s: float | None,
        stdin: str | None,
        ping_interval_s: float,
    ) -> None:
        """Run a command and stream NDJSON events (start, stdout/stderr, ping, exit) as chunks."""
        started = time.monotonic()
        process = await _spawn(argv, env=env, cwd=cwd, stdin=stdin, capture=True)
        self._foreground.add(process)
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        readers = [
            asyncio.ensure_future(_pump_output(process.stdout, "stdout", events)),
            asyncio.ensure_future(_pump_output(process.stderr, "stderr", events)),
        ]
        if stdin is not None:
            asyncio.ensure_future(_feed_stdin(process, stdin))
        waiter = asyncio.ensure_future(self._wait(process, timeout_s, readers, events))
        writer.write(chunked_head(200, "application/x-ndjson"))
        try:
            await _send_event(writer, {"event": "start", "pid": process.pid})
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), ping_interval_s)
                except TimeoutError:
                    event = {"event": "ping"}
                if event is None:
                    break
                await _send_event(writer, event)
            code, timed_out = waiter.result()
            await _send_event(writer, {
                "event": "exit", "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None, "timed_out": timed_out,
                "duration_ms": int((time.monotonic() - started) * 1000),
            })
            writer.write(LAST_CHUNK)
            await writer.drain()
        except ConnectionError:
            _kill_group(process)  # the client went away: the real server kills the command too
            raise
        finally:
            self._foreground.discard(process)
            if not waiter.done():
                _kill_group(process)

    async def _wait(
        self,
        process: asyncio.subprocess.Process,
        timeout_s: float | None,
        readers: list[asyncio.Future[None]],
        events: asyncio.Queue[dict[str, Any] | None],
    ) -> tuple[int, bool]:
        timed_out = False
        try:
            code = await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            _kill_group(process)
            code = await process.wait()
        # A detached grandchild may keep the pipes open; do not wait on it forever.
        _, pending = await asyncio.wait(readers, timeout=_DRAIN_AFTER_EXIT_S)
        for reader in pending:
            reader.cancel()
        events.put_nowait(None)
        return code, timed_out


async def _spawn(
    argv: list[str], *, env: dict[str, str], cwd: Path, stdin: str | None, capture: bool
) -> asyncio.subprocess.Process:
    if not cwd.is_dir():
        raise HttpFailure(400, f"working directory {cwd} does not exist")
    pipe = asyncio.subprocess.PIPE if capture else asyncio.subprocess.DEVNULL
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=pipe, stderr=pipe, env=env, cwd=str(cwd), start_new_session=True,
        )
    except OSError as exc:
        raise HttpFailure(400, f"cannot start {argv[0]!r}: {exc.strerror}") from None


async def _pump_output(
    stream: asyncio.StreamReader | None, name: str, events: asyncio.Queue[dict[str, Any] | None]
) -> None:
    assert stream is not None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while data := await stream.read(_READ_SIZE):
        if text := decoder.decode(data):
            events.put_nowait({"event": name, "data": text})
    if tail := decoder.decode(b"", final=True):
        events.put_nowait({"event": name, "data": tail})


async def _feed_stdin(process: asyncio.subprocess.Process, text: str) -> None:
    assert process.stdin is not None
    try:
        process.stdin.write(text.encode())
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def _send_event(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    writer.write(chunk(json.dumps(event).encode() + b"\n"))
    await writer.drain()
