"""Where ``trace`` reads records from: a store file on disk, or a running recorder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from openenv_harness.cli.errors import CLIError


class StoreSource:
    def __init__(self, path: str) -> None:
        if not Path(path).is_file():
            raise CLIError(f"no record store at {path}", "pass --store runs/<run>/records.db (printed by `run`)")
        from openenv_harness.recorder.store.sqlite import SQLiteStore

        self.store = SQLiteStore(path)

    def sessions(self) -> list[dict[str, Any]]:
        rows = self.store.load_sessions()
        return [
            {"session_id": r.session_id, "status": r.status, "stop_reason": r.stop_reason, "created_at": r.created_at,
             "calls": (r.state.get("totals") or {}).get("calls", 0),
             "agent_calls": (r.state.get("totals") or {}).get("agent_calls", 0),
             "harness": r.spec.get("harness"), "metadata": r.spec.get("metadata", {}),
             "last_error": r.state.get("last_error")}
            for r in rows
        ]

    def records(self, session_id: str) -> list[dict[str, Any]]:
        return asyncio.run(self.store.read_records(session_id))


class RecorderSource:
    def __init__(self, url: str, admin_token: str | None) -> None:
        if not admin_token:
            raise CLIError("reading from a recorder needs its admin token", "pass --admin-token or set OEH_ADMIN_TOKEN")
        from openenv_harness.recorder.client import RecorderClient

        self.client = RecorderClient(url, admin_token)

    def sessions(self) -> list[dict[str, Any]]:
        return self.client.sessions()

    def records(self, session_id: str) -> list[dict[str, Any]]:
        return self.client.records(session_id)


def open_source(store: str | None, url: str | None, admin_token: str | None) -> StoreSource | RecorderSource:
    if url:
        return RecorderSource(url, admin_token)
    if store:
        return StoreSource(store)
    raise CLIError("say where the records are", "pass --store PATH or --url URL --admin-token TOKEN")
