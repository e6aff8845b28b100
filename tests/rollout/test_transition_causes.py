"""Each drift and break cause, named on real agents: the real Pi and OpenCode CLIs through the recorder,
the reference engine serving TRL 1.16's ``qwen3_training.jinja`` (it renders replayed reasoning in the
tool loop, so what an agent does with reasoning shows in the ids).

- OpenCode replays ``reasoning`` as ``reasoning_content``. vLLM 0.32's chat route renames it back (the
  reference engine does the same): the chain stays exact, and the certification -- probed through the
  render route, as the chat route renders -- says both names render. An engine that drops
  ``reasoning_content`` (as vLLM's ``/tokenize`` does) makes it a drift: ``reasoning_renamed``.
- Pi drops reasoning that is only whitespace (its message conversion skips "empty" thinking): the
  template rendered it, the replay has none: ``reasoning_dropped``. OpenCode keeps it: exact.
- Qwen3's original template drops an empty think block from a turn once a tool result follows it
  (certification: ``tool_prefix`` fails): ``template_rerenders_turn``; its training variant keeps it: exact.
- Qwen3.5's think templates end the generation prompt in ``<think>\\n``; a turn sampled without
  reasoning re-renders that newline merged with the next: the next prompt departs inside the parent's,
  no message changed, the certified turn start failed: ``junction_retokenized`` (a break).
- Compaction (Pi after an overflow error, OpenCode at its context limit) replaces the history with a
  summary the agent asked the model for: ``history_rewritten``, not an edited message.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses.base import HarnessOptions
from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import HarnessSessionFactory
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, ToolCallSpec, Turn

from rollout_helpers import ADMIN

pytestmark = pytest.mark.cli
MODEL = "causes"
WRITE = ToolCallSpec(name="bash", arguments={"command": "printf 'hello from the agent\\n' > greeting.txt"})
#: vLLM 0.32's own words for a prompt over the context (Pi recognizes them as an overflow and compacts)
OVERFLOW = ("This model's maximum context length is 2048 tokens. However, your prompt contains 2300 input tokens, "
            "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.")


def _trl_template(name: str = "qwen3_training.jinja") -> Path:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / name
    assert path.is_file(), f"TRL {trl.__version__} ships no {name}"
    return path


def _qwen25_folder() -> Path:
    from openenv_harness.engine import engine_home, prepared_model_dir

    folder = prepared_model_dir(engine_home())
    if folder is None:
        pytest.fail("the Qwen2.5 model folder is not installed: run ./dev setup", pytrace=False)
    return folder


def _rollout(harness: str, script: Script, *, fault: Fault | None = None, factory: dict[str, Any] | None = None,
             template: str = "qwen3_training.jinja", real_tokenizer: bool = False,
             **engine: Any) -> tuple[list[dict], dict]:
    """One real-CLI rollout of write-greeting; its records and the recorder's template certification."""
    config = (EngineConfig.for_model(_qwen25_folder(), chat_template=_trl_template(template), **engine)
              if real_tokenizer else EngineConfig(chat_template=_trl_template(template), **engine))
    with tempfile.TemporaryDirectory() as tmp, EngineServer(config) as server:
        server.set_script(MODEL, script)
        if fault is not None:
            server.add_fault(MODEL, fault)
        recorder_config = RecorderConfig(store_path=f"{tmp}/r.db", engine_url=server.url, admin_token=ADMIN)
        with RecorderServer(recorder_config) as recorder:
            sessions = HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN,
                                             model=MODEL, **(factory or {}))
            session = sessions.create("write-greeting")
            try:
                session.wait_for_completion(timeout_s=120)
                records = session.client.records(session.session_id)
                certification = session.client.health()["engine"]["template_certification"]
            finally:
                session.close()
    return records, certification


def _agent(records: list[dict]) -> list[dict]:
    return [r for r in records if r["metadata"]["call_kind"] == "agent" and r["metadata"].get("fidelity")]


def _transitions(records: list[dict]) -> list[tuple[str, str | None]]:
    return [(r["metadata"]["fidelity"]["class"], r["metadata"]["fidelity"].get("cause")) for r in _agent(records)]


def _replayed(record: dict) -> dict:
    return [m for m in record["request"]["messages"] if m["role"] == "assistant"][-1]


def _reasoning_script(reasoning: str) -> Script:
    return Script(turns=[Turn(reasoning=reasoning, tool_calls=[WRITE]), Turn(content="Wrote greeting.txt.")])


@pytest.mark.parametrize(("harness", "replay", "expected"), [
    ("opencode", "rename", [("root", None), ("exact", None)]),
    ("opencode", "drop", [("root", None), ("replay_drift", "reasoning_renamed")]),
    ("pi", "drop", [("root", None), ("exact", None)]),  # Pi replays the name it received
])
def test_a_renamed_reasoning_field_drifts_only_where_the_engine_drops_the_new_name(
        harness: str, replay: str, expected: list, cli_paths) -> None:
    records, certification = _rollout(harness, _reasoning_script("Write the file first."), reasoning_content=replay)
    assert _transitions(records) == expected
    replayed = _replayed(_agent(records)[1])
    name = "reasoning_content" if harness == "opencode" else "reasoning"
    assert replayed[name] == "Write the file first."
    assert certification["probed_via"] == "render"  # the chat route's own rendering, not /tokenize's


@pytest.mark.parametrize(("harness", "expected"), [
    ("pi", [("root", None), ("replay_drift", "reasoning_dropped")]),
    ("opencode", [("root", None), ("exact", None)]),
])
def test_reasoning_an_agent_drops_is_named(harness: str, expected: list, cli_paths) -> None:
    records, _ = _rollout(harness, _reasoning_script(" "))
    first, second = _agent(records)
    assert first["response"]["choices"][0]["message"]["reasoning"] == " "  # what the engine's parser returned
    assert _transitions(records) == expected
    assert ("reasoning" in _replayed(second) or "reasoning_content" in _replayed(second)) is (harness == "opencode")


SEQ = ToolCallSpec(name="bash", arguments={"command": "seq 1 1200"})  # ~4.6k ids of output a turn
READ = ToolCallSpec(name="bash", arguments={"command": "seq 1 1990"})  # ~7.7k ids: one long first read


@pytest.mark.parametrize(("harness", "context", "long_outputs", "max_output"), [
    ("pi", None, [], 1024), ("opencode", 4096, [], 1024), ("opencode", 14000, [SEQ, SEQ], 1024),
    ("opencode", 15000, [READ], 1000)])
def test_compaction_is_named_history_rewritten(harness: str, context: int | None, long_outputs: list[ToolCallSpec],
                                               max_output: int, cli_paths) -> None:
    """Whatever the context size -- compaction before the first answer, after two long tool outputs
    filled the context, or on the second call after one long first read (15k context, 1k output) --
    the call after compaction is named ``history_rewritten``: as a break, or, where the kept system
    prompt and tool list are most of the parent's ids, as a drift."""
    turns = [Turn(tool_calls=[call]) for call in long_outputs]
    script = Script(turns=[*turns, Turn(tool_calls=[WRITE]), Turn(content="Wrote greeting.txt.")],
                    aux_text="Summary: the agent wrote greeting.txt.")
    options = HarnessOptions(compaction=True)
    if harness == "pi":  # Pi compacts when the engine answers with an overflow, then retries
        records, _ = _rollout(harness, script, fault=Fault(status=400, message=OVERFLOW, on_turn=1),
                              factory={"options": options, "budgets": {"max_agent_calls": 4}})
    else:  # OpenCode compacts once its context (told smaller than its own prompt) is full
        records, _ = _rollout(harness, script, factory={
            "options": options, "context_window": context, "max_output_tokens": max_output,
            "budgets": {"max_agent_calls": 2 + len(long_outputs)}})
    kinds = [(r["metadata"]["call_kind"], r["metadata"].get("aux_rule")) for r in records]
    at = kinds.index(("aux", f"{harness}-compaction"))
    after = next(r for r in records[at + 1:] if r["metadata"]["call_kind"] == "agent" and r["metadata"].get("fidelity"))
    assert any("Summary: the agent wrote greeting.txt." in str(m.get("content")) for m in after["request"]["messages"])
    fidelity = after["metadata"]["fidelity"]
    assert fidelity["class"] in ("break", "replay_drift") and fidelity["cause"] == "history_rewritten", fidelity
    if long_outputs == [READ]:  # the long read was the second call's prompt; the compaction came after it
        agent = [r for r in records[:at] if r["metadata"]["call_kind"] == "agent"]
        assert len(agent) == 2 and len(agent[1]["prompt_token_ids"]) > context > len(agent[0]["prompt_token_ids"])
        assert fidelity["class"] == "break"


@pytest.mark.parametrize(("template", "expected"), [
    ("qwen3.jinja", [("root", None), ("replay_drift", "template_rerenders_turn")]),
    ("qwen3_training.jinja", [("root", None), ("exact", None)]),
])
def test_a_template_that_drops_an_empty_think_block_is_named(template: str, expected: list, cli_paths) -> None:
    script = Script(turns=[Turn(tool_calls=[WRITE]), Turn(content="Wrote greeting.txt.")])  # no reasoning
    records, certification = _rollout("opencode", script, template=template)
    assert certification["properties"]["tool_prefix"] is (template == "qwen3_training.jinja")
    assert _transitions(records) == expected


def test_a_failed_turn_start_is_named_on_the_break_it_causes(cli_paths) -> None:
    script = Script(turns=[Turn(tool_calls=[WRITE]), Turn(content="Wrote greeting.txt.")])  # no reasoning
    # the merge is the real Qwen tokenizer's ("\\n\\n" is one id): the built-in test tokenizer has none
    records, certification = _rollout("opencode", script, template="qwen3_5_think_training.jinja",
                                      real_tokenizer=True, tool_call_parser="qwen3_xml")
    assert certification["properties"]["turn_start"] is False and certification["properties"]["junction"] is True
    assert certification["exact_in"] == ["incremental"]
    assert _transitions(records) == [("root", None), ("break", "junction_retokenized")]
