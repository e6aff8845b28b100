"""Episodes of the harness environment, end to end, through OpenEnv's own WebSocket client.

The environment server runs on a loopback port with its recorder and the reference engine inside;
the agents are the real, unmodified CLIs. Nothing here talks to the environment object directly.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from harness_env import HarnessEnv, RunAgent, fetch_records, records_url
from harness_env.models import HarnessObservation
from openenv.core.harness import TrainingTrace

from openenv_harness.recorder import ThreadedServer

from env_support import ADMIN, SLOW_MARKER

pytestmark = pytest.mark.cli


def _client(server: ThreadedServer) -> HarnessEnv:
    return HarnessEnv(base_url=server.url)


def _marker_pids() -> set[int]:
    """Processes whose command line carries the slow task's marker (the agent's shell tool)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if SLOW_MARKER.encode() in cmdline:
            found.add(int(entry.name))
    return found


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.parametrize(("harness", "task_id"), [
    ("pi", "fix-add"), ("pi", "fix-range-sum"), pytest.param("opencode", "fix-add", marks=pytest.mark.slow)])
def test_scripted_solution_scores_one_and_its_records_are_reachable(
        env_server: ThreadedServer, harness: str, task_id: str) -> None:
    from openenv_harness.harnesses.install import ensure_installed

    ensure_installed([harness])
    with _client(env_server).sync() as env:
        started = env.reset(task_id=task_id, harness=harness)
        first = started.observation
        assert isinstance(first, HarnessObservation)
        assert started.done is False and started.reward is None
        assert (first.task_id, first.harness) == (task_id, harness) and first.instruction
        assert first.session_id.startswith("r-") and first.records is not None
        running = env.state()
        assert running.phase == "running" and running.session_id == first.session_id

        result = env.step(RunAgent(timeout_s=120))
        obs = result.observation
        assert result.done is True and obs.done is True
        assert result.reward == 1.0 and obs.reward == 1.0, (obs.error, obs.verify_output)
        assert obs.exit_code == 0 and obs.agent_ok is True and obs.timed_out is False
        assert obs.session_id == first.session_id and obs.final_answer
        trace = obs.trace
        assert trace is not None
        assert trace.agent_calls == 4  # three bash turns and the final answer
        assert trace.chain == {"exact": 3, "replay_drift": 0, "break": 0}
        assert trace.chain_status == "exact (3 transitions)" and trace.rows == 1
        assert trace.calls == trace.agent_calls + trace.aux_calls and trace.failed_calls == 0

        # the full records, through this server (the recorder runs inside it on loopback)
        location = obs.records
        assert location is not None and location.proxy_path
        records = fetch_records(location, ADMIN, env_server.url)
        assert len(records) == trace.calls
        assert {r["metadata"]["session_id"] for r in records} == {obs.session_id}
        agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
        assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root", "exact", "exact", "exact"]
        for prev, nxt in zip(agent, agent[1:]):
            head = prev["prompt_token_ids"] + prev["completion_token_ids"]
            assert nxt["prompt_token_ids"][: len(head)] == head
        assert sum(len(r["prompt_token_ids"]) for r in records) == trace.prompt_tokens
        assert sum(len(r["completion_token_ids"]) for r in records) == trace.completion_tokens
        # the observation's compact per-call lines describe the same calls
        digests = obs.metadata["calls"]
        assert [d["call_index"] for d in digests] == [r["metadata"]["call_index"] for r in records]
        assert [d["completion_tokens"] for d in digests] == [len(r["completion_token_ids"]) for r in records]
        # the recorder's own URL serves the same records; its training trace is OpenEnv's
        direct = fetch_records(location, ADMIN)
        assert [r["metadata"]["node_id"] for r in direct] == [r["metadata"]["node_id"] for r in records]
        response = httpx.get(records_url(location, env_server.url, what="training_trace"),
                             headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)
        response.raise_for_status()
        turns = TrainingTrace.model_validate(response.json()).turns
        assert [t.node_id for t in turns] == [r["metadata"]["node_id"] for r in agent]

        done = env.state()
        assert (done.phase, done.reward, done.step_count) == ("done", 1.0, 1)
        with pytest.raises(RuntimeError, match="is done; call reset"):
            env.step(RunAgent())
    session = httpx.get(f"{location.recorder_url}/admin/sessions/{obs.session_id}",
                        headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    assert session["status"] == "closed" and session["metadata"]["task_id"] == task_id


def test_an_agent_that_gives_up_scores_zero(env_server: ThreadedServer, pi_cli: Path) -> None:
    with _client(env_server).sync() as env:
        env.reset(task_id="give-up", harness="pi")  # no scripted solution: the model gives up
        result = env.step(RunAgent(timeout_s=120))
    obs = result.observation
    assert result.done is True
    assert result.reward == 0.0 and obs.reward == 0.0  # scored, and failed -- not unscored (None)
    assert obs.exit_code == 0 and "cannot solve" in (obs.final_answer or "")
    assert "done.txt" in obs.verify_output  # the verifier's failure, shown
    assert obs.trace is not None and obs.trace.agent_calls == 1 and obs.trace.chain_status == "single call"


def test_step_timeout_kills_the_agent_and_scores_what_it_left(env_server: ThreadedServer, pi_cli: Path) -> None:
    with _client(env_server).sync() as env:
        env.reset(task_id="slow", harness="pi")
        started = time.monotonic()
        # long enough for the agent's first call to be answered on a loaded machine (the session closes
        # at the deadline: a call not answered by then is cancelled, not recorded as served), far
        # shorter than the 45 s tool it then runs
        result = env.step(RunAgent(timeout_s=12))
        elapsed = time.monotonic() - started
    obs = result.observation
    assert elapsed < 40
    assert result.done is True and obs.timed_out is True and obs.exit_code is None
    assert result.reward == 0.0  # done.txt was never written
    assert obs.trace is not None and obs.trace.agent_calls >= 1
    _wait_for(lambda: not _marker_pids(), 15, "the agent's tool process to be gone")


def test_close_kills_the_agent_and_closes_its_session(env_server: ThreadedServer, pi_cli: Path) -> None:
    env = _client(env_server).sync()
    env.connect()
    try:
        obs = env.reset(task_id="slow", harness="pi").observation
        _wait_for(lambda: bool(_marker_pids()), 60, "the agent to start its slow tool call")
    finally:
        env.close()  # the server destroys the WebSocket session, which closes the environment
    _wait_for(lambda: not _marker_pids(), 20, "close() to kill the agent's processes")
    assert obs.records is not None

    def status() -> str:
        return httpx.get(f"{obs.records.recorder_url}/admin/sessions/{obs.session_id}",
                         headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()["status"]

    _wait_for(lambda: status() == "closed", 20, "close() to close the recorder session")


def test_a_new_reset_ends_the_running_episode(env_server: ThreadedServer, pi_cli: Path) -> None:
    with _client(env_server).sync() as env:
        first = env.reset(task_id="slow", harness="pi").observation
        _wait_for(lambda: bool(_marker_pids()), 60, "the first agent to start its slow tool call")
        before = _marker_pids()
        second = env.reset(task_id="write-greeting", harness="pi").observation
        assert second.session_id != first.session_id and env.state().session_id == second.session_id
        _wait_for(lambda: not (_marker_pids() & before), 20, "the first agent's processes to be killed")
        assert httpx.get(f"{first.records.recorder_url}/admin/sessions/{first.session_id}", timeout=30,
                         headers={"authorization": f"Bearer {ADMIN}"}).json()["status"] == "closed"
        result = env.step(RunAgent(timeout_s=120))
    assert result.observation.task_id == "write-greeting" and result.reward == 1.0


@pytest.mark.slow
def test_seed_chooses_the_task_and_concurrent_episodes_stay_apart(env_server: ThreadedServer, pi_cli: Path) -> None:
    tasks = httpx.post(f"{env_server.url}/harness_env/tasks", json={"split": "train"}, timeout=30).json()["tasks"]
    ids = [t["id"] for t in tasks]
    results: dict[int, HarnessObservation] = {}
    errors: list[BaseException] = []

    def episode(seed: int) -> None:
        try:
            with _client(env_server).sync() as env:
                env.reset(seed=seed, harness="pi")
                results[seed] = env.step(RunAgent(timeout_s=120)).observation
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    seeds = [ids.index("fix-add"), ids.index("write-greeting") + len(ids)]  # seed % n picks the task
    threads = [threading.Thread(target=episode, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert [results[s].task_id for s in seeds] == ["fix-add", "write-greeting"]
    assert all(results[s].reward == 1.0 for s in seeds), [(results[s].error, results[s].verify_output) for s in seeds]
    assert results[seeds[0]].session_id != results[seeds[1]].session_id


def test_pid_scan_sees_this_process() -> None:
    """The /proc scan the kill tests rely on finds a process by its command line."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", SLOW_MARKER])
    try:
        _wait_for(lambda: child.pid in _marker_pids(), 10, "the marker process")
    finally:
        child.kill()
        child.wait()
    assert child.pid not in _marker_pids()
    assert os.getpid() not in _marker_pids()
