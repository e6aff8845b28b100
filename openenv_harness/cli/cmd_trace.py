"""``openenv-harness trace``: list sessions, show one, export its records."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from openenv_harness.cli.errors import CLIError
from openenv_harness.cli.records_source import open_source

app = typer.Typer(no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 150)

STORE = typer.Option(None, "--store", help="Record store (runs/<run>/records.db)")
URL = typer.Option(None, "--url", help="A running recorder instead of a store file")
TOKEN = typer.Option(None, "--admin-token", envvar="OEH_ADMIN_TOKEN", help="Admin token for --url")


@app.command("list")
def list_sessions(store: str = STORE, url: str = URL, admin_token: str = TOKEN) -> None:
    """Sessions in a store or a recorder."""
    src = open_source(store, url, admin_token)
    t = Table()
    for col in ("session", "status", "stop", "calls", "agent calls", "harness", "task"):
        t.add_column(col)
    for s in src.sessions():
        t.add_row(s["session_id"], s.get("status", ""), s.get("stop_reason") or "", str(s.get("calls", "")),
                  str(s.get("agent_calls", "")), s.get("harness") or "", str((s.get("metadata") or {}).get("task_id", "")))
    console.print(t)


def _delta_text(md: dict[str, Any]) -> str:
    fid = md.get("fidelity") or {}
    if fid.get("class") in ("replay_drift", "break"):
        return f"@{fid.get('divergence_at')} (+{fid.get('drift_tokens')})"
    return ""


@app.command("show")
def show(session_id: str, store: str = STORE, url: str = URL, admin_token: str = TOKEN,
         delta: bool = typer.Option(False, help="Also print per-strategy trainable-token ratios")) -> None:
    """One session: its calls, chain status, budgets and errors."""
    src = open_source(store, url, admin_token)
    records = src.records(session_id)
    if not records:
        raise CLIError(f"no records for session {session_id}", "`openenv-harness trace list` shows the sessions")
    t = Table(title=f"session {session_id}")
    for col in ("#", "kind", "status", "prompt", "sampled", "finish", "chain", "divergence", "policy v", "error"):
        t.add_column(col)
    for r in records:
        md = r["metadata"]
        err = (md.get("error") or {}).get("message") or "; ".join(md.get("invalid_reasons") or [])
        pv = f"{md.get('policy_version_start')}" + ("→" + str(md.get("policy_version_end")) if md.get("straddled_sync") else "")
        t.add_row(str(md["call_index"]), md.get("call_kind", ""), md.get("status", ""), str(len(r["prompt_token_ids"])),
                  str(len(r["completion_token_ids"])), str(md.get("finish_reason") or ""),
                  (md.get("fidelity") or {}).get("class", ""), _delta_text(md), pv, err[:60])
    console.print(t)
    last = records[-1]["metadata"].get("limits") or {}
    console.print(f"budget state after the last call: {json.dumps(last)}")
    if delta:
        from openenv_harness.assembly import compare_strategies

        st = Table(title="training samples per assembly strategy")
        for col in ("strategy", "samples", "exact", "drift", "breaks", "trainable tokens", "lost",
                    "trainable / sampled", "trainable / all row tokens"):
            st.add_column(col)

        def ratio(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        for strategy, stats in compare_strategies(records).items():
            st.add_row(strategy, str(stats.traces), str(stats.exact), str(stats.replay_drift), str(stats.breaks),
                       str(stats.trainable_tokens), str(stats.resolutions.lost_tokens),
                       ratio(stats.trainable_ratio), ratio(stats.trainable_ratio_all_tokens))
        console.print(st)


@app.command("export")
def export(
    session_id: str,
    store: str = STORE, url: str = URL, admin_token: str = TOKEN,
    format: str = typer.Option("entries", "--format", help="entries (TraceEntry JSONL) | training (OpenEnv "
                               "TrainingTrace JSON) | harness (HarnessTrace JSON)"),
    strategy: str = typer.Option("split", help="harness format: split | realign | approximate"),
    out: str = typer.Option("-", "--out", help="File (default stdout)"),
) -> None:
    """Export a session's records."""
    src = open_source(store, url, admin_token)
    records = src.records(session_id)
    if format == "entries":
        text = "".join(json.dumps(r) + "\n" for r in records)
    elif format == "training":
        from openenv_harness.contract import to_training_trace

        text = to_training_trace(records).model_dump_json(indent=1)
    elif format == "harness":
        from openenv_harness.assembly import assemble_session

        assembled = assemble_session(records, strategy=strategy)  # type: ignore[arg-type]
        text = json.dumps([t.model_dump() for t in assembled.traces], indent=1)
    else:
        raise CLIError(f"unknown format {format!r}", "use entries, training or harness")
    if out == "-":
        sys.stdout.write(text)
    else:
        with open(out, "w") as f:
            f.write(text)
        console.print(f"wrote {out}", style="dim")
