"""TRL's own weight-sync fence calls, routed through the recorder by ``install_recorder_fence``.

TRL's ``WeightTransferClient`` cannot be constructed here (its constructor demands vLLM for the
NCCL half); its pause/resume/send methods are plain Python over ``self.vllm``, so the tests build
it without the constructor and run those real methods. Everything else is real: TRL's
``VLLMClient`` over HTTP, the recorder, and the reference engine's dev-mode ``/pause``/``/resume``.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderAPIError, RecorderClient
from openenv_harness.testing.engine import EngineConfig, Script, Turn
from openenv_harness.trainer import RecorderFencedEngine, install_recorder_fence

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
from trl.experimental.async_grpo.vllm_client import VLLMClient  # noqa: E402
from trl.experimental.async_grpo.weight_transfer import WeightTransferClient  # noqa: E402

pytestmark = pytest.mark.compat

MODEL = "fence-model"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
LONG_ANSWER = "a reply long enough to still be decoding when the trainer pauses the engine " * 2


@pytest.fixture(scope="module", autouse=True)
def accelerate_state() -> None:
    from accelerate.state import PartialState

    PartialState()  # TRL logs through accelerate, which insists on an initialised state


def trl_trainer(engine_url: str, model_version: int = 0) -> SimpleNamespace:
    """The attributes of an ``AsyncGRPOTrainer`` the fence touches, holding TRL's real clients."""
    vllm_client = VLLMClient(engine_url)
    transfer = object.__new__(WeightTransferClient)  # skips only the vLLM import check
    transfer.vllm = vllm_client
    transfer.model_update_group = None  # no NCCL group: send_weights returns at once
    return SimpleNamespace(vllm_client=vllm_client, weight_transfer=transfer, model_version=model_version)


def merged_sync(trainer: SimpleNamespace, between: Any = None) -> None:
    """The main-process steps of TRL's ``_sync_weight_merged``, in its order."""
    trainer.weight_transfer.pause()
    if between is not None:
        between()
    trainer.weight_transfer.send_weights(iter(()))
    trainer.weight_transfer.resume()
    trainer.model_version += 1


def agent_call(admin: RecorderClient) -> tuple[dict[str, Any], threading.Thread, dict[str, httpx.Response]]:
    """Start one agent call in a thread; returns the session, the thread and where its reply lands."""
    session = admin.create_session()
    reply: dict[str, httpx.Response] = {}

    def call() -> None:
        reply["r"] = httpx.post(
            f"{session['base_url']}/chat/completions", timeout=60,
            headers={"authorization": f"Bearer {session['secret']}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "go"}], "tools": TOOLS},
        )

    thread = threading.Thread(target=call)
    thread.start()
    return session, thread, reply


def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_trl_merged_sync_is_fenced_by_the_recorder_and_versions_follow_the_trainer(make_stack) -> None:
    stack = make_stack(EngineConfig(decode_delay_s=0.03))
    stack.engine.set_script(MODEL, Script(turns=[Turn(content=LONG_ANSWER)]))
    trainer = trl_trainer(stack.engine.url, model_version=4)  # e.g. resumed from a checkpoint at v4
    fenced = install_recorder_fence(trainer, stack.recorder.url, stack.admin_token)
    assert isinstance(fenced, RecorderFencedEngine)
    assert trainer.vllm_client is fenced and trainer.weight_transfer.vllm is fenced

    in_flight, t1, r1 = agent_call(stack.admin)
    wait_until(lambda: stack.engine.info()["in_flight"] == 1)
    held: dict[str, Any] = {}

    def while_paused() -> None:
        assert stack.engine.is_paused()  # the recorder paused the engine for TRL
        assert stack.admin.health()["fence"]["paused"] is True
        served_before = len(stack.engine.requests(MODEL))
        held["call"] = agent_call(stack.admin)  # arrives during the sync
        time.sleep(0.4)
        assert t1.is_alive()  # keep mode: frozen, not failed
        assert len(stack.engine.requests(MODEL)) == served_before  # the new call waits at the recorder

    merged_sync(trainer, between=while_paused)
    assert not stack.engine.is_paused()
    assert trainer.model_version == 5 == fenced.policy_version()

    t1.join(30)
    late, t2, r2 = held["call"]
    t2.join(30)
    assert r1["r"].status_code == 200 and r2["r"].status_code == 200  # nothing torn, nothing failed
    straddler = stack.admin.records(in_flight["session_id"])[0]["metadata"]
    assert (straddler["policy_version_start"], straddler["policy_version_end"], straddler["straddled_sync"]) == (
        4, 5, True)
    after = stack.admin.records(late["session_id"])[0]["metadata"]
    assert (after["policy_version_start"], after["policy_version_end"], after["straddled_sync"]) == (5, 5, False)


def test_lora_sync_path_and_every_other_call_reach_the_engine_directly(make_stack) -> None:
    stack = make_stack()
    trainer = trl_trainer(stack.engine.url)
    fenced = install_recorder_fence(trainer, stack.recorder.url, stack.admin_token)
    assert install_recorder_fence(trainer, stack.recorder.url, stack.admin_token) is fenced  # idempotent
    # not the fence: TRL's own VLLMClient methods, straight to the engine
    assert trainer.vllm_client.server_url == stack.engine.url
    trainer.vllm_client.wait_for_server_ready()
    assert trainer.vllm_client.get_max_model_len() == 32768
    assert fenced.engine_client.get_max_model_len() == 32768
    # TRL's LoRA sync: vllm_client.pause() -> load adapter -> vllm_client.resume() -> model_version = v + 1
    for expected in (1, 2):
        trainer.vllm_client.pause()
        assert stack.engine.is_paused()
        trainer.vllm_client.resume()
        trainer.model_version = expected
        assert not stack.engine.is_paused()
        assert fenced.policy_version() == expected
    assert fenced.syncs == 2


def test_an_engine_that_cannot_pause_fails_the_sync_loudly_and_reopens_the_fence(make_stack) -> None:
    stack = make_stack(EngineConfig(dev_mode=False))  # vLLM without VLLM_SERVER_DEV_MODE=1
    trainer = trl_trainer(stack.engine.url)
    install_recorder_fence(trainer, stack.recorder.url, stack.admin_token)
    with pytest.raises(RecorderAPIError) as err:
        trainer.weight_transfer.pause()
    assert err.value.status == 502 and "/pause" in err.value.message
    assert stack.admin.health()["fence"]["paused"] is False  # agents are not left waiting


def test_non_main_ranks_and_bad_modes() -> None:
    assert install_recorder_fence(SimpleNamespace(vllm_client=None), "http://127.0.0.1:9", "t") is None
    with pytest.raises(ValueError, match="pause mode"):
        RecorderFencedEngine(object(), RecorderClient("http://127.0.0.1:9", "t"), mode="drain")
    with pytest.raises(AttributeError):
        RecorderFencedEngine(object(), RecorderClient("http://127.0.0.1:9", "t")).no_such_method


def test_two_recorders_in_front_of_one_engine_sync_as_one(make_stack, tmp_path) -> None:
    """The first recorder pauses the engine, the second fences around it: a call kept across the sync
    on the second is flagged, both serve the trainer's new version after it."""
    from openenv_harness.recorder import RecorderConfig, RecorderServer

    stack = make_stack(EngineConfig(decode_delay_s=0.03))
    stack.engine.set_script(MODEL, Script(turns=[Turn(content=LONG_ANSWER)]))
    second = RecorderServer(RecorderConfig(store_path=str(tmp_path / "second.db"), engine_url=stack.engine.url,
                                           admin_token=stack.admin_token)).start()
    try:
        with RecorderClient(second.url, stack.admin_token) as admin2:
            trainer = trl_trainer(stack.engine.url, model_version=2)
            fenced = install_recorder_fence(trainer, [stack.recorder.url, second.url], stack.admin_token)
            assert fenced is not None and len(fenced.others) == 1
            in_flight, t1, r1 = agent_call(admin2)
            wait_until(lambda: stack.engine.info()["in_flight"] == 1)

            def while_paused() -> None:
                assert stack.engine.is_paused()
                assert stack.admin.health()["fence"]["paused"] and admin2.health()["fence"]["paused"]

            merged_sync(trainer, between=while_paused)
            assert not admin2.health()["fence"]["paused"]
            assert trainer.model_version == 3 == fenced.policy_version() == admin2.health()["fence"]["policy_version"]
            t1.join(30)
            assert r1["r"].status_code == 200
            md = admin2.records(in_flight["session_id"])[0]["metadata"]
            assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (2, 3, True)
            fenced.close()
    finally:
        second.stop()


def test_a_failed_engine_pause_reopens_the_other_recorders_fences(make_stack, tmp_path) -> None:
    from openenv_harness.recorder import RecorderConfig, RecorderServer

    stack = make_stack(EngineConfig(dev_mode=False))
    second = RecorderServer(RecorderConfig(store_path=str(tmp_path / "second.db"), engine_url=stack.engine.url,
                                           admin_token=stack.admin_token)).start()
    try:
        with RecorderClient(second.url, stack.admin_token) as admin2:
            trainer = trl_trainer(stack.engine.url)
            install_recorder_fence(trainer, [stack.recorder.url, second.url], stack.admin_token)
            with pytest.raises(RecorderAPIError):
                trainer.weight_transfer.pause()
            assert admin2.health()["fence"]["paused"] is False
            assert stack.admin.health()["fence"]["paused"] is False
    finally:
        second.stop()
