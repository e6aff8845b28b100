"""Print how a recorded session assembles into training samples, offline.

Hardware: CPU only. No engine and no GPU are needed: this reads records that a recorder already
stored, and runs the trainer-side assembler (``openenv_harness.assembly``) on them.

Where the records come from (one of):

    python examples/assemble_offline.py --store runs/demo/records.db          # the recorder's SQLite store
    python examples/assemble_offline.py --records session.jsonl               # `openenv-harness trace export`
    python examples/assemble_offline.py --url http://127.0.0.1:8400 --admin-token "$OEH_ADMIN_TOKEN"

``--session ID`` (repeatable) picks sessions; by default every session of the source is shown.
For each session it prints its chains, every call with its transition (exact, replay drift with
the divergence position, or break with its cause), and, per assembly strategy (split, realign,
approximate), the samples built and the share of tokens that train. ``--json`` prints the same
as one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from openenv_harness.assembly import AssemblyError, Transition, assemble_session, compare_strategies
from openenv_harness.contract import records_by_session


class SourceError(RuntimeError):
    """The records could not be read from where the user pointed."""


def _records_from_jsonl(path: Path) -> dict[str, list[dict[str, Any]]]:
    if not path.is_file():
        raise SourceError(f"no records file at {path}")
    try:
        return records_by_session(path.read_text().splitlines(), source=str(path))
    except ValueError as exc:
        raise SourceError(str(exc)) from None


def _records_from_store(path: Path, wanted: list[str]) -> dict[str, list[dict[str, Any]]]:
    if not path.is_file():
        raise SourceError(f"no record store at {path}")
    from openenv_harness.recorder.store.sqlite import SQLiteStore

    store = SQLiteStore(path)
    ids = wanted or [row.session_id for row in store.load_sessions()]
    return {session_id: asyncio.run(store.read_records(session_id)) for session_id in ids}


def _records_from_recorder(url: str, token: str | None, wanted: list[str]) -> dict[str, list[dict[str, Any]]]:
    if not token:
        raise SourceError("reading from a recorder needs its admin token: pass --admin-token or set OEH_ADMIN_TOKEN")
    from openenv_harness.recorder.client import RecorderAPIError, RecorderClient

    with RecorderClient(url, token) as client:
        try:
            ids = wanted or [s["session_id"] for s in client.sessions()]
            return {session_id: client.records(session_id) for session_id in ids}
        except RecorderAPIError as exc:
            raise SourceError(str(exc)) from exc


def load_sessions(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Records per session id, in the order the source lists sessions."""
    if args.records:
        sessions = _records_from_jsonl(Path(args.records))
        if args.session:
            missing = [s for s in args.session if s not in sessions]
            if missing:
                raise SourceError(f"no records for session(s) {', '.join(missing)} in {args.records}")
            sessions = {s: sessions[s] for s in args.session}
    elif args.store:
        sessions = _records_from_store(Path(args.store), args.session)
    else:
        sessions = _records_from_recorder(args.url, args.admin_token, args.session)
    empty = [s for s, records in sessions.items() if not records]
    if empty:
        raise SourceError(f"no records for session(s) {', '.join(empty)}")
    if not sessions:
        raise SourceError("the source holds no sessions")
    return sessions


def _transition_view(transition: Transition | None, call_index: dict[str, int]) -> dict[str, Any]:
    if transition is None:
        return {"kind": "start"}
    view: dict[str, Any] = {"kind": transition.kind, "from_call": call_index[transition.from_node]}
    if transition.kind == "replay_drift":
        view.update(divergence=transition.divergence, drift_tokens=transition.drift_tokens)
    elif transition.kind == "break":
        view.update(cause=transition.cause, shared_tokens=transition.divergence)
    return view


def describe_session(session_id: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Chains, transitions and per-strategy numbers of one session, as plain data."""
    assembled = assemble_session(records, strategy="split")
    call_index = {call.node_id: call.call_index for call in assembled.calls}
    by_node = {t.to_node: t for t in assembled.transitions}
    chains = [
        {
            "chain_id": chain.chain_id,
            "calls": [
                {
                    "call_index": call.call_index,
                    "node_id": call.node_id,
                    "prompt_tokens": len(call.prompt),
                    "sampled_tokens": len(call.completion),
                    "transition": _transition_view(by_node.get(call.node_id), call_index),
                }
                for call in chain.calls
            ],
        }
        for chain in assembled.chains
    ]
    strategies = {
        name: {
            "samples": stats.traces,
            "trainable_tokens": stats.trainable_tokens,
            "lost_tokens": stats.resolutions.lost_tokens,
            "approximate_samples": stats.approximate_traces,
            "trainable_ratio": stats.trainable_ratio,
            "trainable_ratio_all_tokens": stats.trainable_ratio_all_tokens,
        }
        for name, stats in compare_strategies(records).items()
    }
    stats = assembled.stats
    return {
        "session_id": session_id,
        "records": len(records),
        "agent_calls": stats.calls,
        "excluded": stats.excluded,
        "transitions": {"exact": stats.exact, "replay_drift": stats.replay_drift, "break": stats.breaks},
        "eot_id": stats.eot_id,
        "chains": chains,
        "strategies": strategies,
    }


def _transition_text(view: dict[str, Any]) -> str:
    kind = view["kind"]
    if kind == "replay_drift":
        return (f"replay_drift from call {view['from_call']}: diverges at token {view['divergence']}, "
                f"{view['drift_tokens']} sampled tokens not reproduced")
    if kind == "break":
        return f"break ({view['cause']}) from call {view['from_call']}: shares {view['shared_tokens']} tokens"
    if kind == "exact":
        return f"exact from call {view['from_call']}"
    return "start"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_text(summary: dict[str, Any]) -> str:
    excluded = ", ".join(f"{n} {reason}" for reason, n in sorted(summary["excluded"].items())) or "none"
    t = summary["transitions"]
    lines = [
        f"session {summary['session_id']}: {summary['records']} records, {summary['agent_calls']} agent calls "
        f"(left out: {excluded})",
        f"  chains: {len(summary['chains'])}   transitions: {t['exact']} exact, {t['replay_drift']} replay_drift, "
        f"{t['break']} break",
    ]
    for chain in summary["chains"]:
        lines.append(f"  chain {chain['chain_id']}: {len(chain['calls'])} calls")
        for call in chain["calls"]:
            lines.append(f"    call {call['call_index']:>3}  prompt {call['prompt_tokens']:>6}  "
                         f"sampled {call['sampled_tokens']:>5}  {_transition_text(call['transition'])}")
    lines.append(f"  {'strategy':<12}{'samples':>8}{'trainable':>11}{'lost':>6}{'trainable/response':>20}"
                 f"{'trainable/all':>15}")
    for name, row in summary["strategies"].items():
        lines.append(f"  {name:<12}{row['samples']:>8}{row['trainable_tokens']:>11}{row['lost_tokens']:>6}"
                     f"{_ratio(row['trainable_ratio']):>20}{_ratio(row['trainable_ratio_all_tokens']):>15}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", help="the recorder's SQLite store (records.db)")
    source.add_argument("--records", help="a JSONL export of records")
    source.add_argument("--url", help="a running recorder's root URL")
    parser.add_argument("--admin-token", default=os.environ.get("OEH_ADMIN_TOKEN"), help="admin token for --url")
    parser.add_argument("--session", action="append", default=[], help="session id to show (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sessions = load_sessions(args)
        summaries = [describe_session(session_id, records) for session_id, records in sessions.items()]
    except (SourceError, AssemblyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"sessions": summaries}, indent=1))
    else:
        print("\n\n".join(render_text(summary) for summary in summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
