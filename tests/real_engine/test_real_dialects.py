"""Every agent beyond Pi and OpenCode on the real vLLM, one rollout each: real Codex (Responses API),
real Claude Code (Anthropic Messages API), real Gemini CLI (Google ``generateContent``) and the other
chat-completions agents (``DIALECTS``).

The same recorder, the same flow: each CLI's calls reach vLLM's chat route, and what is recorded is
what vLLM sampled -- prompt ids, sampled ids, logprobs, checked against vLLM's own replies as the
capture proxy saw them. Sampling is pinned as for Pi and OpenCode (greedy, seeded, tool calls
required: this 0.5B model answers in a JSON code block otherwise; 256 tokens at most, 64 for Claude
Code). What each CLI sends back of the model's turn is its own: every non-root transition carries its
class and a named cause. Claude Code's default prompt is ~12k tokens (its system prompt and tools'
schemas): minutes of prefill a call on a CPU without AVX-512, more than a rollout can wait. Here it
runs with its own ``--tools Bash,Read,Edit`` and a short ``--system-prompt`` (the same CLI, the same
Messages wire format, a prompt a CPU prefills in seconds); the reference-engine tier runs it with its
full default prompt (``tests/recorder/dialects``, ``tests/rollout/test_dialect_agents.py``). Gemini CLI's
is ~18k ids: it runs with the same short system prompt (``GEMINI_SYSTEM_MD``) and three core tools; Qwen
Code's ~26k with the same prompt (``--system-prompt``), its core tools and no skills; Cline with the same
prompt (``--system``) and three tools; Kilo without its planning and background tools (``REAL_ENGINE_OPTIONS``).
"""

from __future__ import annotations

from typing import Any

import pytest
from openenv.core.harness import TrainingTurn

from capture_proxy import CaptureProxy
from real_stack import ADMIN, AGENT_CALLS, MODEL, RealStack
from openenv_harness.cli.stack import REAL_ENGINE_OPTIONS, REAL_ENGINE_SAMPLING
from openenv_harness.harnesses.base import HarnessOptions
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

#: the agents beyond Pi and OpenCode (``test_real_rollouts``), by the dialect each speaks
DIALECTS = {"codex": "responses", "claude-code": "anthropic", "gemini-cli": "gemini", "grok-cli": "chat",
            "continue": "chat", "mini-swe-agent": "chat", "qwen-code": "chat", "kilo": "chat", "cline": "chat"}
#: Claude Code's calls run to the cap whatever it is (its tool arguments are long; the cut is part of what is
#: tested), and decoding is what a loaded CPU slows most (vLLM's threads are bound to the cores): 64 for it.
MAX_TOKENS = {**dict.fromkeys(DIALECTS, REAL_ENGINE_SAMPLING["max_tokens"]), "claude-code": 64}
WALL_S = dict.fromkeys(DIALECTS, 400)
#: Claude Code's own options for a prompt a CPU prefills in seconds (what `run --engine vllm` gives it too)
OPTIONS = {harness: REAL_ENGINE_OPTIONS.get(harness, HarnessOptions()) for harness in DIALECTS}
#: the first test's bound holds the module fixture's rollouts, one after another: each ends at its wall
#: clock budget at the latest (a loaded CPU decodes slowly and every agent then runs to it), plus the
#: stack's start -- not the tier's default bound, which nine rollouts at their budget exceed
TIMEOUT_S = sum(wall + 50 for wall in WALL_S.values()) + 600

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


@pytest.fixture(scope="module")
def dialect_rollouts(vllm, tmp_path_factory) -> dict[str, Any]:
    from openenv_harness.harnesses.install import ensure_installed

    ensure_installed(list(DIALECTS))
    capture = CaptureProxy(vllm.url).start()
    stack = RealStack(tmp_path_factory.mktemp("dialects") / "records.db", capture.url)
    out: dict[str, Any] = {}
    try:
        for harness in DIALECTS:
            capture.clear()
            factory = HarnessSessionFactory(harness=harness, recorder_url=stack.recorder.url, admin_token=ADMIN,
                                            model=MODEL, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                            budgets={"max_agent_calls": AGENT_CALLS,
                                                     "max_wall_clock_s": WALL_S[harness]},
                                            sampling={**REAL_ENGINE_SAMPLING, "max_tokens": MAX_TOKENS[harness]},
                                            options=OPTIONS[harness])
            report, session = run_rollout(factory, "fix-add", timeout_s=WALL_S[harness] + 50)
            assert session is not None, report.error
            records = stack.admin.records(session.session_id)
            trace = session.fetch_training_trace()
            session.close()
            out[harness] = {"report": report, "records": records, "trace": trace,
                            "exchanges": capture.sampled_chat_exchanges()}
    finally:
        stack.close()
        capture.stop()
    return out


def _served(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent calls the engine answered; a call the budget refused after them (the CLI asked once
    more) is recorded failed, with its reason, and is checked apart."""
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    served = [r for r in agent if r["metadata"]["status"] == "ok"]
    refused = [r for r in agent if r["metadata"]["status"] != "ok"]
    assert all(r["metadata"]["error"]["kind"] == "budget_exhausted" for r in refused), refused
    assert agent == served + refused, "a refused call comes only after the budget's last served one"
    return served


@pytest.mark.parametrize("harness", list(DIALECTS))
def test_each_dialect_records_what_vllm_sampled(harness: str, dialect_rollouts: dict[str, Any]) -> None:
    run = dialect_rollouts[harness]
    agent = _served(run["records"])
    assert run["report"].agent_calls == len(agent) >= 2, run["report"]
    sampled = {tuple(e.reply_json()["prompt_token_ids"]): e.reply_json() for e in run["exchanges"]}
    for record in agent:
        md = record["metadata"]
        assert md["dialect"] == DIALECTS[harness] and md["provenance"]["harness"] == harness
        assert md["status"] == "ok" and md["trainable"] is True, md["invalid_reasons"]
        raw = sampled[tuple(record["prompt_token_ids"])]  # the ids vLLM sampled from, none other
        assert record["completion_token_ids"] == raw["choices"][0]["token_ids"]
        assert record["per_token_logps"] == [e["logprob"] for e in raw["choices"][0]["logprobs"]["content"]]
        assert md["provenance"]["decoding_constraint"] == {"tool_choice": "required"}
    # each later call carries what the CLI made of the previous answer: a tool result, or (Claude Code, when
    # a call was cut at max_tokens and vLLM parsed no tool call) the answer's text and a nudge to go on
    assert all(r["request"]["messages"][-1]["role"] in ("tool", "user") for r in agent[1:])


@pytest.mark.parametrize("harness", list(DIALECTS))
def test_each_transition_is_classified_with_its_cause(harness: str, dialect_rollouts: dict[str, Any]) -> None:
    run = dialect_rollouts[harness]
    agent = _served(run["records"])
    fidelity = [r["metadata"]["fidelity"] for r in agent]
    assert fidelity[0]["class"] == "root"
    for f in fidelity[1:]:
        assert f["class"] in ("exact", "replay_drift"), f
        if f["class"] == "replay_drift":
            # under the grammar the model samples the tool-call tag as text; the template renders its id --
            # also when the agent replays a cut-off call as text: the first difference is the tag
            assert f["cause"] == "tag_sampled_as_text", f
    turns = run["trace"].turns
    assert [t.node_id for t in turns] == [r["metadata"]["node_id"] for r in agent]
    for turn in turns:
        assert TrainingTurn.model_validate(turn.model_dump()) == turn
