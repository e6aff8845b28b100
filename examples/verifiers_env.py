"""Hand recorded agent sessions to verifiers 0.4 as its own traces and episodes.

Hardware: CPU only. No engine and no GPU: the sessions were already recorded (by the recorder in
front of the trainer's engine); this builds verifiers' message graph from their token evidence.

Run it with the Python of an environment that has verifiers installed. verifiers 0.4 pins
``mcp==2`` and OpenEnv needs ``mcp<2``, so that is a separate environment::

    python3 -m venv .venv-verifiers
    .venv-verifiers/bin/pip install verifiers==0.4.0
    .venv-verifiers/bin/pip install --no-deps -e .

    .venv-verifiers/bin/python examples/verifiers_env.py --records session.jsonl --out results/
    .venv-verifiers/bin/python examples/verifiers_env.py --url http://127.0.0.1:8400 --admin-token "$OEH_ADMIN_TOKEN"

Per session it prints verifiers' branches (the samples a verifiers trainer such as prime-rl
trains on) next to our assembler's ``split`` samples, and says whether they are identical.
``--reward SESSION=VALUE`` stores an environment's ``verify()`` result (``none`` = unscored).
``--out DIR`` appends one verifiers ``Episode`` per session to ``DIR/traces.jsonl``, the file
verifiers' own tools read. Why records go in after the fact instead of verifiers running the
agent itself: see docs/integrations.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from openenv_harness.assembly import AssemblyError, assemble_session
from openenv_harness.contract import records_by_session

#: Traces built per session: (text block, verifiers Trace).
Converted = tuple[str, Any]


class SourceError(RuntimeError):
    """The records could not be read from where the user pointed, or could not be converted."""


def _from_jsonl(path: Path) -> dict[str, list[dict[str, Any]]]:
    if not path.is_file():
        raise SourceError(f"no records file at {path}")
    try:
        return records_by_session(path.read_text().splitlines(), source=str(path))
    except ValueError as exc:
        raise SourceError(str(exc)) from None


def _get(http: httpx.Client, path: str) -> Any:
    response = http.get(path)
    if response.status_code != 200:
        raise SourceError(f"recorder answered HTTP {response.status_code}: {response.text[:200]}")
    return response.json()


def _from_recorder(url: str, token: str | None, wanted: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The recorder's admin API over plain HTTP (the recorder package itself needs OpenEnv's stack)."""
    if not token:
        raise SourceError("reading from a recorder needs its admin token: pass --admin-token or set OEH_ADMIN_TOKEN")
    with httpx.Client(base_url=url.rstrip("/"), headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        ids = wanted or [session["session_id"] for session in _get(http, "/admin/sessions")]
        return {session_id: _get(http, f"/admin/sessions/{session_id}/records") for session_id in ids}


def _parse_reward(text: str) -> tuple[str, float | None]:
    session_id, sep, value = text.partition("=")
    if not sep or not session_id:
        raise argparse.ArgumentTypeError(f"expected SESSION=VALUE, got {text!r}")
    if value.strip().lower() == "none":
        return session_id, None
    try:
        return session_id, float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"reward for {session_id} must be a number or 'none', got {value!r}") from exc


def describe(session_id: str, records: list[dict[str, Any]], reward: float | None) -> Converted:
    """The text block for one session, and its verifiers trace."""
    from openenv_harness.integrations.verifiers import branch_sample, compare_with_assembly, records_to_trace

    trace = records_to_trace(records, reward=reward)
    comparison = compare_with_assembly(trace, assemble_session(records, strategy="split"))
    verdict = "yes" if comparison.identical else (
        f"no ({len(comparison.unmatched_branches)} branch(es) and {len(comparison.unmatched_traces)} sample(s) "
        f"differ; sampled tokens {comparison.branch_sampled_tokens} vs trainable {comparison.trace_trainable_tokens})"
    )
    lines = [
        f"session {session_id}: {len(trace.calls)} agent calls -> {comparison.branches} verifiers branch(es), "
        f"{comparison.traces} split sample(s); identical: {verdict}"
    ]
    for branch in trace.branches:
        sample = branch_sample(branch)
        lines.append(f"  branch {sample.index}: {len(sample.token_ids)} tokens, {sample.sampled_tokens} sampled, "
                     f"{'trainable' if sample.trainable else 'not trainable'}")
    scored = trace.rewards.get("verify")
    lines.append(f"  reward verify: {'unscored' if scored is None else scored.score}")
    return "\n".join(lines), trace


def write_episodes(out: Path, traces: list[Any]) -> Path:
    """Append one verifiers ``Episode`` per trace to ``out/traces.jsonl``, verifiers' own writer."""
    from verifiers.v1.utils.trace_store import TRACES_FILE, write_episode

    from openenv_harness.integrations.verifiers import session_episode

    out.mkdir(parents=True, exist_ok=True)
    for trace in traces:
        write_episode(out, session_episode(trace))
    return out / TRACES_FILE


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--records", help="a JSONL export of records (one or more sessions)")
    source.add_argument("--url", help="a running recorder's root URL")
    parser.add_argument("--admin-token", default=os.environ.get("OEH_ADMIN_TOKEN"), help="admin token for --url")
    parser.add_argument("--session", action="append", default=[], help="session id to convert (repeatable)")
    parser.add_argument("--reward", action="append", default=[], type=_parse_reward, metavar="SESSION=VALUE",
                        help="the environment's verify() result for a session; 'none' = unscored")
    parser.add_argument("--out", help="directory to append verifiers episodes to (traces.jsonl)")
    return parser.parse_args(argv)


def select_sessions(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The records of the sessions asked for. Runs before verifiers is imported (that takes
    seconds), so a bad source fails at once."""
    if args.records:
        sessions = _from_jsonl(Path(args.records))
    else:
        sessions = _from_recorder(args.url, args.admin_token, args.session)
    wanted = args.session or list(sessions)
    if not wanted:
        raise SourceError("the source holds no sessions")
    missing = [s for s in wanted if not sessions.get(s)]
    if missing:
        raise SourceError(f"no records for session(s) {', '.join(missing)}")
    return {s: sessions[s] for s in wanted}


def convert(sessions: dict[str, list[dict[str, Any]]], rewards: dict[str, float | None]) -> list[Converted]:
    from openenv_harness.integrations.verifiers import VerifiersIntegrationError

    try:
        return [describe(s, records, rewards.get(s)) for s, records in sessions.items()]
    except (AssemblyError, VerifiersIntegrationError) as exc:
        raise SourceError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        converted = convert(select_sessions(args), dict(args.reward))
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n\n".join(block for block, _ in converted))
    if args.out:
        path = write_episodes(Path(args.out), [trace for _, trace in converted])
        print(f"\nwrote {len(converted)} episode(s) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
