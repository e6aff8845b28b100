"""An infrastructure fault is never a failed task: such rollouts are unscored, with the cause."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from openenv_harness.harnesses.base import HarnessOptions, HarnessResult
from openenv_harness.recorder import RecorderServer
from openenv_harness.rollout.launch import resolve_options
from openenv_harness.rollout.unscored import unscored_reason
from openenv_harness.sandbox.base import SandboxError
from openenv_harness.sandbox.local import LocalSandbox
from openenv_harness.testing.engine import EngineServer

from rollout_helpers import scripted_factory

OK = HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer="done")
CRASHED = HarnessResult(ok=False, exit_code=1, process_exit_code=139, final_answer=None, error="Segmentation fault")


def _info(**info):
    return lambda: info


def _unreachable():
    raise OSError("connection refused")


@pytest.mark.parametrize("result, info, faults, timed_out, expected", [
    (OK, _info(), ["the relay link dropped 1 time(s)"], False, None),  # survived the blip: scored
    (CRASHED, _info(stop_reason="max_agent_calls"), ["relay"], False, None),  # the policy spent its budget
    (CRASHED, _info(), [], True, None),  # killed at its deadline with nothing wrong: out of time
    (CRASHED, _info(last_error={"message": "engine: 500"}), [], False, "engine error: engine: 500"),
    (CRASHED, _unreachable, [], False, "recorder unreachable"),
    (CRASHED, _info(), ["the relay link to the trainer dropped 2 time(s)"], False, "infrastructure fault: the relay"),
    (CRASHED, _info(), ["sandbox failed: gone"], True, "infrastructure fault: sandbox failed"),
    (CRASHED, _info(), [], False, "harness crash?): Segmentation fault"),
])
def test_the_rule(result, info, faults, timed_out, expected) -> None:
    reason = unscored_reason(result, session_info=info, sandbox_faults=faults, timed_out=timed_out)
    assert (reason is None) if expected is None else (reason is not None and expected in reason), reason


def _crashing_cli(tmp_path: Path) -> str:
    """A stand-in for the agent CLI that dies at once without a model call (as a crashing node would)."""
    script = tmp_path / "crashing-agent"
    script.write_text("#!/bin/sh\necho 'FATAL ERROR: Reached heap limit' >&2\nexit 134\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_harness_that_crashes_with_no_model_call_failing_is_unscored(
    tmp_path: Path, engine: EngineServer, recorder: RecorderServer
) -> None:
    factory = scripted_factory(engine, recorder, "pi", "fix-add", executable=_crashing_cli(tmp_path))
    session = factory.create("fix-add")
    try:
        assert session.wait_for_completion(timeout_s=60) != 0
        verified = session.verify([])
        assert verified.env_reward is None  # not the 0.0 the untouched sandbox would score
        reason = verified.metrics["unscored_reason"]
        assert "no model call failed" in reason and "heap limit" in reason
    finally:
        session.close()


class _FailingSandbox(LocalSandbox):
    """A test double: a sandbox whose process checks fail (the remote machine went away)."""

    def start(self, *args, **kwargs):
        process = super().start(*args, **kwargs)

        def wait(timeout_s=None):
            raise SandboxError("HF sandbox: cannot check the agent process: 503 Service Unavailable")

        process.wait = wait  # type: ignore[method-assign]
        return process


def test_a_sandbox_that_fails_under_the_agent_is_unscored(
    tmp_path: Path, engine: EngineServer, recorder: RecorderServer
) -> None:
    factory = scripted_factory(engine, recorder, "pi", "fix-add", executable=_crashing_cli(tmp_path),
                               sandbox_factory=_FailingSandbox)
    session = factory.create("fix-add")
    try:
        assert session.wait_for_completion(timeout_s=60) != 0  # not raised: TRL goes on to verify
        verified = session.verify([])
        assert verified.env_reward is None
        assert "sandbox failed: HF sandbox: cannot check the agent process" in verified.metrics["unscored_reason"]
    finally:
        session.close()


class _Remote(LocalSandbox):
    remote = True


def test_retries_are_on_where_the_agent_has_a_network_path_of_its_own() -> None:
    assert resolve_options(HarnessOptions(), LocalSandbox()).retries is False
    assert resolve_options(HarnessOptions(), _Remote()).retries is True
    assert resolve_options(HarnessOptions(retries=False), _Remote()).retries is False  # an explicit choice stands
    assert resolve_options(HarnessOptions(retries=True), LocalSandbox()).retries is True
