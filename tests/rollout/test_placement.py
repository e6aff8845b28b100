"""Sessions spread over two recorders (real ``RecorderServer``s on loopback): least live sessions
first, each trace read from the recorder holding it, one recorder down leaves the other serving."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.serving import free_port
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.placement import NoRecorderAvailable, RecorderPool
from openenv_harness.rollout.session import RolloutCaptureError
from openenv_harness.testing.engine import EngineConfig, EngineServer, Script
from openenv_harness.testing.recorder_process import start_recorder_process

from rollout_helpers import ADMIN


def _recorder(store: Path, engine: EngineServer, port: int | None = None) -> RecorderServer:
    return RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN),
                          port=port).start()


@pytest.fixture
def two(tmp_path: Path, engine: EngineServer) -> Iterator[list[RecorderServer]]:
    servers = [_recorder(tmp_path / f"r{i}.db", engine) for i in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def _open_on(pool: RecorderPool, n: int) -> list[str]:
    """Place ``n`` sessions and create each where it was placed; the recorder URLs, in order."""
    placed = []
    for _ in range(n):
        slot = pool.place()
        with RecorderClient(slot.url, ADMIN) as client:
            client.create_session()
        pool.release(slot)
        placed.append(slot.url)
    return placed


def test_sessions_go_to_the_recorder_with_fewest_live_sessions(two: list[RecorderServer]) -> None:
    a, b = two
    with RecorderClient(a.url, ADMIN) as client:
        for _ in range(3):
            client.create_session()  # someone else's sessions: the recorder's own count includes them
    pool = RecorderPool([a.url, b.url], ADMIN)
    assert _open_on(pool, 3) == [b.url] * 3
    assert Counter(_open_on(pool, 4)) == {a.url: 2, b.url: 2}
    # closed sessions are not live
    with RecorderClient(b.url, ADMIN) as client:
        for s in client.sessions():
            client.close_session(s["session_id"], grace_s=0)
    assert _open_on(pool, 2) == [b.url] * 2


def test_a_recorder_down_is_skipped_and_none_up_is_a_clear_error(two: list[RecorderServer]) -> None:
    a, b = two
    pool = RecorderPool([a.url, b.url], ADMIN, health_timeout_s=2)
    b.stop()
    assert _open_on(pool, 3) == [a.url] * 3
    a.stop()
    with pytest.raises(NoRecorderAvailable) as err:
        pool.place()
    assert a.url in str(err.value) and b.url in str(err.value)


def test_agent_urls_must_match_the_recorders() -> None:
    with pytest.raises(ValueError, match="2 recorder URLs but 1 agent"):
        RecorderPool(["http://127.0.0.1:1", "http://127.0.0.1:2"], ADMIN, agent_urls=["http://x:1"])


@pytest.fixture
def slow_engine() -> Iterator[EngineServer]:
    with EngineServer(EngineConfig(prefill_delay_s=0.5)) as e:
        yield e


def _recorder_process(store: Path, engine: EngineServer, port: int) -> subprocess.Popen:
    """A recorder in a process of its own, so that it can be SIGKILLed."""
    return start_recorder_process(store, engine.url, port, ADMIN)


@pytest.mark.cli
def test_rollouts_over_two_recorders_and_one_killed(cli_paths, tmp_path: Path, slow_engine: EngineServer) -> None:
    """One rollout on each of two recorders; the second recorder is SIGKILLed under its rollout: the
    first completes, the second is unscored with its recorder named, new rollouts go to the one up,
    and the killed recorder, restarted on its store, has every call it acknowledged."""
    model = "ref-pi-fix-add-two-recorders"
    slow_engine.set_script(model, Script(turns=BUILTIN_TASKS["fix-add"].reference_script))
    first = _recorder(tmp_path / "r0.db", slow_engine)
    port = free_port()
    second = _recorder_process(tmp_path / "r1.db", slow_engine, port)
    second_url = f"http://127.0.0.1:{port}"
    factory = HarnessSessionFactory(harness="pi", recorder_url=[first.url, second_url], admin_token=ADMIN,
                                    model=model)
    sessions = []
    try:
        sessions = [factory.create("fix-add") for _ in range(2)]
        assert [s.client.base_url for s in sessions] == [first.url, second_url]  # least live, then round-robin
        doomed = sessions[1]
        assert not doomed.client.wait(doomed.session_id, min_calls=1, timeout_s=60)["timed_out"]
        acknowledged = doomed.client.session(doomed.session_id)["calls"]
        second.send_signal(signal.SIGKILL)
        second.wait(30)
        assert sessions[0].wait_for_completion(timeout_s=120) == 0
        assert sessions[0].verify([]).env_reward == 1.0
        assert len(sessions[0].fetch_training_trace().turns) == 4  # read from the recorder holding it
        doomed.wait_for_completion(timeout_s=120)
        lost = doomed.verify([])
        assert lost.env_reward is None and "recorder unreachable" in lost.metrics["unscored_reason"]
        with pytest.raises(RolloutCaptureError, match=f"recorder {second_url} holding session"):
            doomed.fetch_training_trace()
        third = factory.create("fix-add")  # new rollouts go to the recorder still up
        sessions.append(third)
        assert third.client.base_url == first.url
        assert third.wait_for_completion(timeout_s=120) == 0
        second = _recorder_process(tmp_path / "r1.db", slow_engine, port)
        with RecorderClient(second_url, ADMIN) as client:
            kept = client.records(doomed.session_id)
        assert len(kept) >= acknowledged >= 1
        assert [r["metadata"]["call_index"] for r in kept] == list(range(len(kept)))
    finally:
        for session in sessions:
            session.close()
        first.stop()
        second.kill()
        second.wait(30)


def test_the_trl_factory_takes_several_recorders_and_stays_picklable() -> None:
    import pickle

    from openenv_harness.rollout import TRLSessionFactory

    urls = ["http://127.0.0.1:9001/", "http://127.0.0.1:9002"]
    trl = pickle.loads(pickle.dumps(TRLSessionFactory(harness="pi", recorder_url=urls, admin_token=ADMIN, model="m")))
    factory = trl(sampling={"temperature": 1.0})
    assert [slot.url for slot in factory.pool.slots] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert factory.sampling == {"temperature": 1.0}
