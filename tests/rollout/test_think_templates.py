"""Incremental mode on the reasoning templates users train today, with the real Qwen2.5 tokenizer and
the real agent CLIs: TRL 1.16's Qwen3.5 / 3.6 / 3.8 think templates served by the reference engine.

These templates open a think block in the generation prompt (``<think>\\n``); the real tokenizer
merges that newline with the next one when a sampled turn is rendered back, so the turn's *start*
never replays as the model saw it (certification: ``turn_start`` fails, exact in incremental mode
only). The turn's *end* is stable, and that is all incremental continuation needs: every in-chain
call continues the model's own ids, the chain is one row, and every sampled token is trainable --
with reasoning and without. Full history on the same script shows the break and names it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.assembly import assemble_session
from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import HarnessSessionFactory
from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn

from rollout_helpers import ADMIN
from test_transition_causes import _qwen25_folder, _trl_template

pytestmark = [pytest.mark.cli, pytest.mark.slow]
MODEL = "think"
WRITE = ToolCallSpec(name="bash", arguments={"command": "printf 'hello from the agent\\n' > greeting.txt"})
CHECK = ToolCallSpec(name="bash", arguments={"command": "cat greeting.txt"})


def _script(reasoning: str | None) -> Script:
    return Script(turns=[Turn(reasoning=reasoning, tool_calls=[WRITE]), Turn(reasoning=reasoning, tool_calls=[CHECK]),
                         Turn(reasoning=reasoning, content="Wrote greeting.txt.")])


def _rollout(harness: str, template: str, script: Script, prompt_mode: str) -> tuple[list[dict], dict, Any]:
    source = _trl_template(template)
    config = EngineConfig.for_model(_qwen25_folder(), chat_template=source, reasoning_parser="think",
                                    tool_call_parser="qwen3_xml" if "<function=" in source.read_text() else "hermes")
    with tempfile.TemporaryDirectory() as tmp, EngineServer(config) as server:
        server.set_script(MODEL, script)
        recorder_config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=server.url, admin_token=ADMIN)
        with RecorderServer(recorder_config) as recorder:
            sessions = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN,
                                             model=MODEL, prompt_mode=prompt_mode, require_exact_template=True)
            session = sessions.create("write-greeting")
            try:
                session.wait_for_completion(timeout_s=120)
                reward = session.verify()
                records = session.client.records(session.session_id)
                certification = session.client.health()["engine"]["template_certification"]
            finally:
                session.close()
    return records, certification, reward


def _agent(records: list[dict]) -> list[dict]:
    return [r for r in records if r["metadata"]["call_kind"] == "agent"]


@pytest.mark.parametrize("reasoning", ["I will write the file.", None], ids=["reasoning", "no-reasoning"])
@pytest.mark.parametrize("template", ["qwen3_5_think.jinja", "qwen3_5_think_training.jinja", "qwen3_6.jinja",
                                      "qwen3_8.jinja"])
def test_every_in_chain_call_continues_on_a_think_template(template: str, reasoning: str | None, cli_paths) -> None:
    records, certification, reward = _rollout("opencode", template, _script(reasoning), "incremental")
    assert certification["exact_in"] == ["incremental"], certification
    assert certification["properties"]["turn_start"] is False and certification["properties"]["junction"] is True
    agent = _agent(records)
    assert len(agent) == 3 and reward.env_reward == 1.0
    modes = [r["metadata"]["prompt_mode"] for r in agent]
    assert [m["continued"] for m in modes] == [False, True, True], [m.get("reason") for m in modes]
    assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root", "exact", "exact"]
    trace = assemble_session(records)
    assert trace.stats.traces == 1 and trace.stats.exact == 2 and trace.stats.breaks == 0
    sampled = sum(len(call.completion) for call in trace.calls)
    assert sampled > 0 and trace.stats.trainable_tokens == sampled  # every sampled token, once
    if reasoning is None:
        # what the model saw differs from a full render at each turn's start: said in the record
        assert all(not m["full_render_diff"]["identical"] for m in modes[1:])


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_full_history_on_a_think_template_names_the_break_and_incremental_removes_it(harness: str, cli_paths) -> None:
    script = _script(None)
    full, certification, _ = _full(harness, script)
    classes = [(r["metadata"]["fidelity"]["class"], r["metadata"]["fidelity"].get("cause")) for r in _agent(full)]
    assert classes[0] == ("root", None) and ("break", "junction_retokenized") in classes
    assert assemble_session(full).stats.traces > 1
    incremental, _, _ = _rollout(harness, "qwen3_5_think_training.jinja", script, "incremental")
    assert [r["metadata"]["prompt_mode"]["continued"] for r in _agent(incremental)] == [False, True, True]
    assert assemble_session(incremental).stats.traces == 1


def _full(harness: str, script: Script) -> tuple[list[dict], dict, Any]:
    """Full history on a template not exact in that mode: a plain session (require_exact_template
    would refuse it, as ``test_a_session_is_refused_or_warned`` checks)."""
    source = _trl_template("qwen3_5_think_training.jinja")
    config = EngineConfig.for_model(_qwen25_folder(), chat_template=source, reasoning_parser="think",
                                    tool_call_parser="qwen3_xml")
    with tempfile.TemporaryDirectory() as tmp, EngineServer(config) as server:
        server.set_script(MODEL, script)
        recorder_config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=server.url, admin_token=ADMIN)
        with RecorderServer(recorder_config) as recorder:
            session = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN,
                                            model=MODEL).create("write-greeting")
            try:
                session.wait_for_completion(timeout_s=120)
                return (session.client.records(session.session_id),
                        session.client.health()["engine"]["template_certification"], None)
            finally:
                session.close()


def test_a_session_is_refused_or_warned_by_the_mode_the_template_is_exact_in(tmp_path: Path) -> None:
    from openenv_harness.recorder import RecorderAPIError, RecorderClient

    source = _trl_template("qwen3_5_think_training.jinja")
    config = EngineConfig.for_model(_qwen25_folder(), chat_template=source, reasoning_parser="think",
                                    tool_call_parser="qwen3_xml")
    with EngineServer(config) as server:
        recorder_config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=server.url, admin_token=ADMIN)
        with RecorderServer(recorder_config) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
            incremental = admin.create_session(prompt_mode="incremental", require_exact_template=True)
            warned = admin.create_session()
            with pytest.raises(RecorderAPIError) as refused:
                admin.create_session(require_exact_template=True)
    assert incremental["warnings"] == []
    assert len(warned["warnings"]) == 1 and "exact in incremental mode only" in warned["warnings"][0]
    assert "turn_start" in warned["warnings"][0] and "incremental prompt mode" in warned["warnings"][0]
    assert refused.value.status == 409 and "not exact in full history mode" in str(refused.value)
