"""RFC 005 white-box mode with the agent remote: the real huggingface_hub.Sandbox client against the
local HF emulator, the agent inside reaching the trainer-side recorder only through the WebSocket
relay, while the trainer's ``ModelStep`` runs here. The rollout must come out as it does locally:
the same reward, the same record shapes and chain, the ModelStep's ids in the records."""

from __future__ import annotations

from pathlib import Path

import pytest
from openenv.core.harness import HarnessRolloutResult, HarnessRunLimits

from openenv_harness.contract import is_training_entry
from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.rollout import BUILTIN_TASKS, AgentCLIAdapter, TaskSession
from openenv_harness.sandbox.hf import HFSandbox
from openenv_harness.testing.hf_emulator import HFEmulator, hub_pointed_at
from openenv_harness.testing.model_step import ScriptedModelStep

pytestmark = pytest.mark.cli

FIX = ["sed -i 's/return a - b/return a + b/' calc.py", "python3 -m unittest -q"]


class WatchedHFSandbox(HFSandbox):
    """Notes, before the sandbox goes, the relay port it started and Pi's model config inside."""

    relay_ports: list[int | None] = []
    pi_models: list[str] = []

    def close(self) -> None:
        WatchedHFSandbox.relay_ports.append(self._relay_http_port)
        try:
            WatchedHFSandbox.pi_models.append(self.read_file(f"{self.home}/.pi/agent/models.json").decode())
        except Exception:  # noqa: BLE001 -- OpenCode keeps no such file
            pass
        super().close()


def shape(result: HarnessRolloutResult) -> list[tuple]:
    return [(r["metadata"]["call_kind"], r["metadata"]["status"], (r["metadata"].get("fidelity") or {}).get("class"),
             sorted(r["metadata"])) for r in result.metrics["trace_entries"]]


def white_box(harness: str, sandbox_factory=None) -> tuple[HarnessRolloutResult, ScriptedModelStep, str]:
    step = ScriptedModelStep(FIX, "Fixed.")
    adapter = AgentCLIAdapter(harness, timeout_s=180, executable=str(ensure_installed([harness])[harness]),
                              sandbox_factory=sandbox_factory)
    try:
        result = adapter.run_white_box(step, TaskSession(BUILTIN_TASKS["fix-add"]),
                                       HarnessRunLimits(max_turns=8, sampling={"temperature": 0.7}))
        return result, step, adapter.recorder().url
    finally:
        adapter.close()


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_remote_white_box_rollout_matches_local(harness: str, tmp_path: Path) -> None:
    local, local_step, _ = white_box(harness)
    WatchedHFSandbox.relay_ports.clear()
    WatchedHFSandbox.pi_models.clear()
    with HFEmulator() as emulator, hub_pointed_at(emulator, tmp_path / "hf-home"):
        remote, remote_step, recorder_url = white_box(harness, lambda: WatchedHFSandbox(ws_scheme="ws://"))
    m = remote.metrics
    assert m["env_reward"] == 1.0 and m["agent_ok"] and m["exit_code"] == 0 and remote.done, m
    # the ModelStep ran here, trainer-side, once per agent turn, with the limits' sampling
    assert len(remote_step.calls) == m["agent_calls"] == 3 and remote_step.calls[0][2]["temperature"] == 0.7
    # the agent reached the recorder only through the relay started in its sandbox
    assert WatchedHFSandbox.relay_ports and WatchedHFSandbox.relay_ports[0] is not None
    if harness == "pi":
        models = WatchedHFSandbox.pi_models[0]
        assert f"127.0.0.1:{WatchedHFSandbox.relay_ports[0]}" in models and recorder_url not in models
    entries = [e for e in m["trace_entries"] if is_training_entry(e)]
    assert remote.completion_ids == sum((e["completion_token_ids"] for e in entries), [])
    assert remote.prompt_ids == sum((e["prompt_token_ids"] for e in entries), [])
    assert shape(remote) == shape(local)
    assert [e.arguments for e in remote.tool_trace] == [e.arguments for e in local.tool_trace]
    assert local.metrics["env_reward"] == 1.0 and len(local_step.calls) == 3
