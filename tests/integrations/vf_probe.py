"""Runs inside the verifiers environment: recorded sessions in, verifiers' view of them out.

Usage: ``python vf_probe.py MANIFEST`` where MANIFEST is JSON ``{name: {"records": path, "reward": x}}``.
Prints one JSON object ``{name: result}``; a record verifiers refuses gives ``{"error": {...}}``.
Each result also carries the assembler's split samples, computed here from the same file, and
checks that the trace survives verifiers' own serialization (what its consumers read).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from verifiers.v1.trace import WireTrace

from openenv_harness.assembly import AssemblyError, assemble_session
from openenv_harness.integrations.verifiers import (
    VerifiersIntegrationError,
    branch_sample,
    compare_with_assembly,
    records_to_trace,
)


def probe(records_path: Path, reward: float | None) -> dict[str, Any]:
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    try:
        trace = records_to_trace(records, reward=reward)
    except (AssemblyError, VerifiersIntegrationError) as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    assembled = assemble_session(records, strategy="split")
    reloaded = WireTrace.model_validate(trace.to_record(float_decimals=None))
    return {
        "branches": [branch_sample(branch).model_dump() for branch in trace.branches],
        "reloaded_branches": [branch_sample(branch).model_dump() for branch in reloaded.branches],
        "comparison": compare_with_assembly(trace, assembled).model_dump(),
        "num_calls": len(trace.calls),
        "call_nodes_sampled": all(trace.nodes[c.node].sampled for c in trace.calls if c.node is not None),
        "num_turns": trace.num_turns,
        "stop_condition": trace.stop_condition,
        "is_completed": trace.is_completed,
        "rewards": {name: None if r is None else r.score for name, r in trace.rewards.items()},
        "trace_reward": trace.reward,
        "info": trace.info["openenv_harness"],
    }


def forbidden_modules() -> list[str]:
    """Modules the bridge must never pull in: OpenEnv (it cannot coexist with verifiers) and the recorder."""
    return sorted(
        name for name in sys.modules
        if name == "openenv" or name.startswith(("openenv.", "openenv_harness.recorder", "openenv_harness.rollout"))
    )


def main() -> None:
    manifest = json.loads(Path(sys.argv[1]).read_text())
    results: dict[str, Any] = {
        name: probe(Path(spec["records"]), spec.get("reward")) for name, spec in manifest.items()
    }
    results["_forbidden_modules"] = forbidden_modules()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
