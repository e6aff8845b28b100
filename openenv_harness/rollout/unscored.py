"""Why a rollout must stay unscored: an infrastructure fault is never a failed task (D7).

A reward of 0.0 enters the group baseline and teaches the policy that what it did was wrong. When
the rollout ended because something *around* the policy failed -- the engine or the recorder, the
relay between a remote sandbox and the trainer, the sandbox itself, or the agent CLI crashing with
no model call to blame -- the policy's work was never judged, so the rollout is unscored (``None``,
left out of the baseline) and the cause is said.

What stays scored: an agent that finished (whatever its answer; the verifier judges the sandbox),
one stopped by a budget (the policy spent it), and one killed at its deadline with no fault seen
(the policy ran out of time). An agent that finished is scored even after a fault it survived (a
relay blip its retry went through).

The order of the checks is the order of the evidence: what the recorder knows, what the sandbox
and its relay saw, then the agent's own account of how it ended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openenv_harness.harnesses.base import HarnessResult


def unscored_reason(
    result: HarnessResult,
    *,
    session_info: Callable[[], dict[str, Any]],
    sandbox_faults: Sequence[str],
    timed_out: bool,
) -> str | None:
    """The cause that keeps this rollout unscored, or None when its reward stands.

    ``session_info`` reads the recorder's view of the session (``RecorderClient.session``); it is
    only called for an agent that did not finish, and an error reading it is itself the cause.
    """
    if result.ok:
        return None
    try:
        info = session_info()
    except Exception as exc:  # noqa: BLE001 -- whatever kept us from asking is not the policy's doing
        return f"recorder unreachable: {type(exc).__name__}: {exc}"
    if info.get("stop_reason"):
        return None  # a budget stop: the policy spent its budget, and is scored for it
    error = info.get("last_error")
    if error:
        return f"agent stopped on an engine error: {error.get('message')}"
    if sandbox_faults:
        return "infrastructure fault: " + "; ".join(sandbox_faults)
    if timed_out:
        return None  # killed at its deadline with nothing else wrong: the policy ran out of time
    why = result.error or f"exit status {result.process_exit_code}"
    return f"the agent ended without finishing and no model call failed (harness crash?): {why}"
