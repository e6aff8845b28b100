"""Real Pi and OpenCode sessions, recorded as a trainer runs them, fed to verifiers' message graph.

The unmodified CLIs solve a built-in task through the recorder and the reference engine; their
records then go through verifiers' own code (``vf_probe.py`` in ``.venv-verifiers``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recorded_sessions import ADMIN, run_verifiers, verifiers_python, write_jsonl

from openenv_harness.assembly import assemble_session
from openenv_harness.contract import is_training_entry
from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.recorder import RecorderServer
from openenv_harness.testing.engine import EngineServer, Script

pytestmark = [pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]

PROBE = Path(__file__).with_name("vf_probe.py")
HARNESSES = ("pi", "opencode")
TASK = "fix-add"


@pytest.fixture(scope="module")
def real_sessions(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    verifiers_python()  # skip before starting any server
    ensure_installed(list(HARNESSES))
    from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory  # imports OpenEnv: seconds

    engine: EngineServer = request.getfixturevalue("engine")
    recorder: RecorderServer = request.getfixturevalue("recorder")
    sessions: dict[str, list[dict[str, Any]]] = {}
    rewards: dict[str, float | None] = {}
    for harness in HARNESSES:
        model = f"vf-cli-{harness}"
        engine.set_script(model, Script(turns=BUILTIN_TASKS[TASK].reference_script))
        factory = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN, model=model)
        session = factory.create(TASK, seed=0, episode_id=f"vf-{harness}")
        try:
            assert session.wait_for_completion(timeout_s=120) == 0, session.agent.output()
            rewards[harness] = session.verify([]).env_reward
            sessions[harness] = session.fetch_proxy_trace()
        finally:
            session.close()
    folder = tmp_path_factory.mktemp("vf-cli")
    manifest = {h: {"records": str(write_jsonl(folder / f"{h}.jsonl", r)), "reward": rewards[h]}
                for h, r in sessions.items()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    done = run_verifiers([str(PROBE), str(folder / "manifest.json")], timeout_s=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return sessions, json.loads(done.stdout)


@pytest.mark.parametrize("harness", HARNESSES)
def test_real_agent_session_is_one_branch_like_our_sample(real_sessions, harness: str) -> None:
    sessions, results = real_sessions
    records = [r for r in sessions[harness] if is_training_entry(r)]
    assembled = assemble_session(sessions[harness], strategy="split")
    assert len(records) >= 2 and len(assembled.traces) == 1
    result = results[harness]
    (branch,) = result["branches"]
    assert branch["token_ids"] == records[-1]["prompt_token_ids"] + records[-1]["completion_token_ids"]
    assert result["comparison"]["matched"] == [{"branch": 0, "trace": 0}]
    assert result["comparison"]["branch_sampled_tokens"] == sum(len(r["completion_token_ids"]) for r in records)
    assert result["rewards"] == {"verify": 1.0}
