"""Each drift and break cause is named from what the recorder sees: the reply, both calls' messages, ids."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from openenv_harness.recorder.chain.drift_cause import break_cause, drift_cause, turn_view

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Fix the bug."}
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


def ids(*values: int) -> bytes:
    return array("I", values).tobytes()


def _certification(rendered: dict | None = None, open_id: int | None = None,
                   args_same: dict | None = None) -> SimpleNamespace:
    props = [SimpleNamespace(name="assistant_stable", facts={"rendered": rendered or {}})]
    if args_same is not None:
        props.append(SimpleNamespace(name="tool_args_roundtrip", facts={"same_as_spaced": args_same}))
    return SimpleNamespace(properties=props, tool_call_open_ids=[open_id] if open_id else [])


def _drift(reply: dict, replayed: dict, *, completion: bytes = ids(5, 6), prompt: bytes = ids(1, 2, 3),
           certification=None) -> str:
    parent = turn_view([SYSTEM, USER], reply, completion)
    messages = [SYSTEM, USER, replayed, {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    return drift_cause(parent, messages, prompt, certification)


@pytest.mark.parametrize(("reply", "replayed", "cause"), [
    ({"role": "assistant", "content": "", "reasoning": "think", "tool_calls": [CALL]},
     {"role": "assistant", "content": "", "tool_calls": [CALL]}, "reasoning_dropped"),
    ({"role": "assistant", "content": "", "reasoning": "think", "tool_calls": [CALL]},
     {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [CALL]}, "reasoning_renamed"),
    ({"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "assistant", "content": "", "tool_calls": [
         {**CALL, "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]}, "tool_arguments_reserialized"),
    ({"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "assistant", "content": "", "tool_calls": [
         {**CALL, "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]}, "edited_message"),
    ({"role": "assistant", "content": "Done."},
     {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}, "content_reflattened"),
    ({"role": "assistant", "content": "Done."}, {"role": "assistant", "content": "Done!"}, "edited_message"),
    ({"role": "assistant", "content": "Done."}, {"role": "assistant", "content": "Done."}, "retokenized"),
])
def test_replay_drift_causes(reply: dict, replayed: dict, cause: str) -> None:
    assert _drift(reply, replayed) == cause


def test_reasoning_the_template_does_not_render() -> None:
    reply = {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [CALL]}
    cert = _certification({"reasoning": True, "reasoning_content": False})
    assert _drift(reply, dict(reply), certification=cert) == "reasoning_not_rendered"


def test_a_renamed_reasoning_field_is_a_cause_only_where_the_new_name_is_not_rendered() -> None:
    """OpenCode replays ``reasoning`` as ``reasoning_content``. vLLM 0.32's chat route renames it back
    before templating (certified through its render route: both names rendered), so the rename
    renders the same and is no cause; on an engine that drops ``reasoning_content`` it is the cause."""
    reply = {"role": "assistant", "content": "", "reasoning": "think", "tool_calls": [CALL]}
    renamed = {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [CALL]}
    both = _certification({"reasoning": True, "reasoning_content": True})
    assert _drift(reply, renamed, certification=both) == "retokenized"
    dropping = _certification({"reasoning": True, "reasoning_content": False})
    assert _drift(reply, renamed, certification=dropping) == "reasoning_renamed"
    neither = _certification({"reasoning": False, "reasoning_content": False})
    assert _drift(reply, renamed, certification=neither) == "reasoning_not_rendered"


def test_a_tag_sampled_as_text_is_told_from_the_ids() -> None:
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    cert = _certification(open_id=151657)
    # sampled "<", "tool", "_call", ">" as text; the next prompt holds the special id
    sampled, replay_prompt = ids(27, 14172, 13429, 29), ids(1, 2, 151657, 198)
    assert _drift(reply, dict(reply), completion=sampled, prompt=replay_prompt, certification=cert) \
        == "tag_sampled_as_text"
    # the special id was sampled itself: not this cause
    assert _drift(reply, dict(reply), completion=ids(151657, 5), prompt=replay_prompt, certification=cert) \
        == "retokenized"


RESPACING = {"spaced": True, "compact": True, "reordered": False}  # vLLM 0.32 + Qwen2.5: parse, then tojson
SPACED_TWICE = {**CALL, "function": {"name": "bash", "arguments": '{"command":  "ls"}'}}
COMPACT = {**CALL, "function": {"name": "bash", "arguments": '{"command":"ls"}'}}


def test_a_respaced_replay_is_no_cause_under_a_template_that_respaces() -> None:
    """Pi replays the parser's arguments compacted; a template that normalizes spacing renders both the same,
    so the cause is what the ids show (here the tag sampled as text), not the agent's re-serialization."""
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    replayed = {"role": "assistant", "content": "", "tool_calls": [COMPACT]}
    sampled, replay_prompt = ids(27, 14172, 13429, 29), ids(1, 2, 151657, 198)
    cert = _certification(open_id=151657, args_same=RESPACING)
    assert _drift(reply, replayed, completion=sampled, prompt=replay_prompt, certification=cert) \
        == "tag_sampled_as_text"
    # the same replay under a template that renders arguments verbatim: the agent's respacing is the cause
    verbatim = _certification(open_id=151657, args_same={"spaced": True, "compact": False, "reordered": False})
    assert _drift(reply, replayed, completion=sampled, prompt=replay_prompt, certification=verbatim) \
        == "tool_arguments_reserialized"
    # key order is kept by that template: a reordered replay is still the agent's doing
    reordered = {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "bash", "arguments": '{"n": 1, "command": "ls"}'}}]}
    two_keys = {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "bash", "arguments": '{"command": "ls", "n": 1}'}}]}
    assert _drift(two_keys, reordered, certification=cert) == "tool_arguments_reserialized"


def test_sampled_argument_spacing_the_template_restyles() -> None:
    """Codex replays the sampled argument text (two spaces); the engine's parser had re-serialized it, and the
    template renders the parsed value in its own style: the sampled text cannot survive replay."""
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    replayed = {"role": "assistant", "content": "", "tool_calls": [SPACED_TWICE]}
    cert = _certification(open_id=151657, args_same=RESPACING)
    assert _drift(reply, replayed, completion=ids(151657, 5), certification=cert) == "tool_arguments_restyled"
    # the same texts on both sides: nothing points at the arguments
    assert _drift(reply, dict(reply), completion=ids(151657, 5), certification=cert) == "retokenized"


def test_break_causes() -> None:
    history = [SYSTEM, USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    parent = turn_view(history, {"role": "assistant", "content": "b"}, ids(5))
    other_system = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": "find x"}]
    assert break_cause(parent, other_system, same_prompt=False) == "sub_agent"
    compacted = [SYSTEM, {"role": "user", "content": "Summary of the conversation so far: ..."},
                 {"role": "user", "content": "go on"}]
    assert break_cause(parent, compacted, same_prompt=False) == "history_rewritten"
    edited = [SYSTEM, {"role": "user", "content": "Fix the other bug."}, *history[2:],
              {"role": "assistant", "content": "b"}]
    assert break_cause(parent, edited, same_prompt=False) == "edited_message"
    assert break_cause(parent, history, same_prompt=True) == "resample"


def test_a_history_carrying_a_compaction_summary_is_rewritten() -> None:
    """OpenCode's compaction keeps the system prompt and replaces the rest with [user, the summary the
    model wrote, user "Continue"]; Pi puts the summary in a user message before the kept turns. By
    shape alone both look like an edited message; the summary text (a compaction call's reply) says
    what happened."""
    parent = turn_view([SYSTEM, USER], {"role": "assistant", "content": "", "tool_calls": [CALL]}, ids(5))
    summary = "Summary: the agent listed the files."
    opencode = [SYSTEM, {"role": "user", "content": "What did we do so far?"},
                {"role": "assistant", "content": summary},
                {"role": "user", "content": "Continue if you have next steps"}]
    assert break_cause(parent, opencode, same_prompt=False) == "edited_message"  # shape only: ambiguous
    assert break_cause(parent, opencode, same_prompt=False, summaries=[summary]) == "history_rewritten"
    compacted = f"compacted:\n<summary>\n{summary}\n</summary>"
    pi = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": compacted}]},
          USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    assert break_cause(parent, pi, same_prompt=False, summaries=[summary]) == "history_rewritten"
    # the same histories classified a drift by their ids (a long kept system prompt and tool list share most
    # of the parent's): named by their messages all the same
    assert drift_cause(parent, opencode, ids(1), summaries=[summary]) == "history_rewritten"
    assert drift_cause(parent, pi, ids(1), summaries=[summary]) == "history_rewritten"
    # no assistant turn where the reply was: the message-level change, as a break's (not "unknown")
    assert drift_cause(parent, [SYSTEM], ids(1)) == "history_rewritten"
    assert drift_cause(parent, [SYSTEM, {"role": "user", "content": "Start over."}], ids(1)) == "edited_message"
    # a summary the parent already carried (an earlier compaction) says nothing about this break
    later = turn_view(opencode, {"role": "assistant", "content": "ok"}, ids(5))
    edited = [*opencode[:3], {"role": "user", "content": "Stop instead."}]
    assert break_cause(later, edited, same_prompt=False, summaries=[summary]) == "edited_message"


def test_a_template_that_re_renders_a_finished_turn_is_the_cause() -> None:
    """Qwen3's original template drops an empty think block from an assistant turn once a tool result
    follows it (certification: tool_prefix fails). The agent replayed the turn faithfully apart from
    respacing the arguments, which this template normalizes anyway: the template is the cause."""
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    replayed = {"role": "assistant", "content": "", "tool_calls": [COMPACT]}
    cert = _certification(open_id=151657, args_same=RESPACING)
    cert.properties.append(SimpleNamespace(name="tool_prefix", required=True, passed=False, facts={}))
    assert _drift(reply, replayed, completion=ids(151657, 5), certification=cert) == "template_rerenders_turn"
    # a prefix-preserving template: the sampled spacing it restyles is what remains
    cert.properties[-1] = SimpleNamespace(name="tool_prefix", required=True, passed=True, facts={})
    assert _drift(reply, replayed, completion=ids(151657, 5), certification=cert) == "tool_arguments_restyled"


def test_a_break_in_an_unchanged_history_under_a_failed_turn_start_is_the_junction() -> None:
    """Qwen3.5's think templates end the generation prompt in ``<think>\\n``; a turn sampled with no
    reasoning re-renders that newline merged with the next one, so the next prompt departs inside the
    parent's own prompt (a break) although no message changed: the certification's turn start says why
    (a version 2 certificate said it in its junction)."""
    history = [SYSTEM, USER]
    parent = turn_view(history, {"role": "assistant", "content": "", "tool_calls": [CALL]}, ids(5))
    grown = [*history, {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    start = SimpleNamespace(properties=[SimpleNamespace(name="turn_start", required=True, passed=False, facts={})],
                            tool_call_open_ids=[], version=3)
    old = SimpleNamespace(properties=[SimpleNamespace(name="junction", required=True, passed=False, facts={})],
                          tool_call_open_ids=[], version=2)
    # version 3: a failed junction is the turn's end, not its start
    end_only = SimpleNamespace(properties=[SimpleNamespace(name="junction", required=True, passed=False, facts={})],
                               tool_call_open_ids=[], version=3)
    assert break_cause(parent, grown, same_prompt=False) == "unknown"
    assert break_cause(parent, grown, same_prompt=False, certification=start) == "junction_retokenized"
    assert break_cause(parent, grown, same_prompt=False, certification=old) == "junction_retokenized"
    assert break_cause(parent, grown, same_prompt=False, certification=end_only) == "unknown"


def test_the_tag_at_the_divergence_names_the_cause_first() -> None:
    """Where the ids first depart decides: a truncated tool call (no parsed call; Claude Code replays the
    text as content) whose ``<tool_call>`` text the template re-tokenizes as the special id, and a replay
    the agent also re-serialized further on -- both show the tag as text first."""
    cert = _certification(open_id=151657)
    sampled = ids(27, 14172, 13429, 29, 4913)  # "<", "tool", "_call", ">", '{"'
    text = {"role": "assistant", "content": '<tool_call>{"name": "Edit", "arguments": {"file_path": "a'}
    parent = turn_view([SYSTEM, USER], text, sampled)
    prompt = ids(1, 2, 151657, 4913)  # prompt[:2] is the parent's prompt; the tag's id at position 2
    messages = [SYSTEM, USER, dict(text), {"role": "user", "content": "go on"}]
    assert drift_cause(parent, messages, prompt, cert, divergence_at=2) == "tag_sampled_as_text"
    assert drift_cause(parent, messages, prompt, cert, divergence_at=3) == "retokenized"  # not the tag there
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    compact = {"role": "assistant", "content": "", "tool_calls": [COMPACT]}
    assert _drift(reply, compact, completion=sampled, prompt=prompt, certification=cert) \
        == "tool_arguments_reserialized"  # no position given: the messages decide
    parent = turn_view([SYSTEM, USER], reply, sampled)
    assert drift_cause(parent, [SYSTEM, USER, compact], prompt, cert, divergence_at=2) == "tag_sampled_as_text"


def test_an_id_is_found_only_at_an_id_boundary() -> None:
    from array import array

    from openenv_harness.recorder.chain.drift_cause import holds_id

    tag = (151657).to_bytes(4, "little")
    assert holds_id(array("I", [1, 2, 151657, 3]).tobytes(), tag)
    assert not holds_id(array("I", [1, 2, 3]).tobytes(), tag) and not holds_id(b"", tag)
    # the tag's bytes across two ids (the high bytes of one, the low bytes of the next) are no match
    straddling = array("I", [151657 << 16 & 0xFFFFFFFF, 151657 >> 16]).tobytes()
    assert tag in straddling and not holds_id(straddling, tag)
    assert holds_id(straddling + tag, tag)  # a real one after a straddling one
