"""Where ``trace`` reads records from: store files on disk, running recorders, or several at once.

Several sources (``--store`` and ``--url`` may each be repeated) are read as one: sessions are
listed from all of them, each with where it lives, and a session's records come from the source
that holds it. With sessions spread over several recorders (``docs/scale-out.md``) that is how a
run's traces are read back. A recorder that does not answer is named, and the others are still read.
"""

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
             "last_error": r.state.get("last_error"), "outcome": r.state.get("outcome")}
            for r in rows
        ]

    def records(self, session_id: str) -> list[dict[str, Any]]:
        return asyncio.run(self.store.read_records(session_id))

    def current_policy_version(self) -> tuple[int | None, str]:
        """The highest policy version any record in the store started or ended under (every session's
        records are read, one at a time: a store knows no version apart from its records)."""
        from openenv_harness.export import highest_policy_version

        highest: int | None = None
        for row in self.store.load_sessions():
            found = highest_policy_version(self.store.iter_records(row.session_id))
            if found is not None and (highest is None or found > highest):
                highest = found
        return highest, "the highest recorded in the store"


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

    def current_policy_version(self) -> tuple[int | None, str]:
        """The recorder's current policy version (its fence's, which every new record starts under)."""
        version = (self.client.health().get("fence") or {}).get("policy_version")
        return (version if isinstance(version, int) else None), "the recorder's current policy version"


class MultiSource:
    """Several stores and recorders read as one; ``problems`` names those that could not be read."""

    def __init__(self, sources: list[tuple[str, StoreSource | RecorderSource]]) -> None:
        self.sources = sources
        self.problems: list[str] = []

    def sessions(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for where, source in self.sources:
            try:
                out += [{**s, "where": where} for s in source.sessions()]
            except Exception as exc:  # noqa: BLE001 -- one unreadable source must not hide the others
                self.problems.append(f"{where}: {type(exc).__name__}: {exc}")
        return out

    def records(self, session_id: str) -> list[dict[str, Any]]:
        from openenv_harness.recorder.client import RecorderAPIError

        for where, source in self.sources:
            try:
                records = source.records(session_id)
            except RecorderAPIError as exc:
                if exc.status != 404:
                    self.problems.append(f"{where}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001
                self.problems.append(f"{where}: {type(exc).__name__}: {exc}")
                continue
            if records:
                return records
        return []


    def current_policy_version(self) -> tuple[int | None, str]:
        """The highest current version over the sources that answer (``problems`` names the others)."""
        best: tuple[int | None, str] = (None, "no source knew one")
        for where, source in self.sources:
            try:
                version, what = source.current_policy_version()
            except Exception as exc:  # noqa: BLE001 -- one unreadable source must not hide the others
                self.problems.append(f"{where}: {type(exc).__name__}: {exc}")
                continue
            if version is not None and (best[0] is None or version > best[0]):
                best = (version, f"{what} {where}")
        return best


def open_source(store: str | list[str] | None, url: str | list[str] | None,
                admin_token: str | None) -> StoreSource | RecorderSource | MultiSource:
    stores = [store] if isinstance(store, str) else list(store or [])
    urls = [url] if isinstance(url, str) else list(url or [])
    sources: list[tuple[str, StoreSource | RecorderSource]] = [(u, RecorderSource(u, admin_token)) for u in urls]
    sources += [(path, StoreSource(path)) for path in stores]
    if not sources:
        raise CLIError("say where the records are", "pass --store PATH or --url URL --admin-token TOKEN "
                       "(either may be repeated)")
    return sources[0][1] if len(sources) == 1 else MultiSource(sources)
