"""The incremental prompt mode on the reference engine: exact chains where full history drifts."""

from __future__ import annotations

import orjson

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import run_agent, tool_script


def _run(engine: EngineServer, admin: RecorderClient, mode: str, *, stream: bool = True,
         **script: object) -> list[dict]:
    s = admin.create_session(prompt_mode=mode)
    engine.set_script(s["session_id"], tool_script(3, **script))  # type: ignore[arg-type]
    run_agent(s["base_url"], s["secret"], stream=stream, echo="pi")
    return admin.records(s["session_id"])


def test_respaced_tool_arguments_give_one_exact_chain(engine: EngineServer, recorder: RecorderServer,
                                                      admin: RecorderClient) -> None:
    full = _run(engine, admin, "full_history", spaced_args=True)
    assert [r["metadata"]["fidelity"]["class"] for r in full] == ["root"] + ["replay_drift"] * 3
    records = _run(engine, admin, "incremental", spaced_args=True)
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    modes = [r["metadata"]["prompt_mode"] for r in records]
    assert modes[0]["continued"] is False and modes[0]["reason"] == "chain_start"
    assert all(m["continued"] for m in modes[1:])
    assert all("tool_arguments_reserialized" in m["equivalences"] for m in modes[1:])
    # the engine's own full render differs exactly where the agent re-spelled the arguments
    assert all(m["full_render_diff"]["identical"] is False for m in modes[1:])
    for prev, rec in zip(records, records[1:]):
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    # the replies the agent got are what a chat call returns: a finished run, tool calls parsed
    assert records[-1]["response"]["choices"][0]["message"]["content"] == "All done."
    # one finish reason per kind of turn in both modes (generate and derender say "stop" for a tool call)
    def finishes(recs: list[dict]) -> list[tuple[str, str]]:
        return [(r["response"]["choices"][0]["finish_reason"], r["metadata"]["finish_reason"]) for r in recs]

    assert finishes(records) == finishes(full) == [("tool_calls", "tool_calls")] * 3 + [("stop", "stop")]


def test_the_chat_routes_finish_reason_rule() -> None:
    from openenv_harness.recorder.prompt_modes.sample_parse import finish_as_chat_route

    def finish(tool_choice: object, calls: bool, reported: str = "stop") -> str:
        reply = {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c"}] if calls else None},
                              "finish_reason": reported}]}
        body = {} if tool_choice is None else {"tool_choice": tool_choice}
        finish_as_chat_route(reply, body)
        return reply["choices"][0]["finish_reason"]

    assert finish(None, True) == finish("auto", True) == finish("required", True) == "tool_calls"
    assert finish({"type": "function", "function": {"name": "bash"}}, True) == "stop"  # named: OpenAI says stop
    assert finish("auto", False) == "stop" and finish("auto", True, reported="length") == "length"


def test_noncanonical_segmentation_stays_exact(engine: EngineServer, recorder: RecorderServer,
                                               admin: RecorderClient) -> None:
    full = _run(engine, admin, "full_history", segmentation="noncanonical", stream=False)
    assert "replay_drift" in [r["metadata"]["fidelity"]["class"] for r in full]
    records = _run(engine, admin, "incremental", segmentation="noncanonical", stream=False)
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    sampled = [f["sampled"] for f in engine.requests(records[0]["metadata"]["session_id"]) if "sampled" in f]
    assert [r["prompt_token_ids"] for r in records] == [s["prompt_token_ids"] for s in sampled]
    assert [r["completion_token_ids"] for r in records] == [s["token_ids"] for s in sampled]


def test_reasoning_under_the_other_field_name_is_the_same_turn(engine: EngineServer, recorder: RecorderServer,
                                                               admin: RecorderClient) -> None:
    """OpenCode replays ``reasoning`` as ``reasoning_content``: a named equivalence, the chain continues."""
    from openenv_harness.testing.engine import Script, ToolCallSpec, Turn

    turns = [Turn(reasoning=f"Step {i} needs a look.", tool_calls=[ToolCallSpec(name="bash", arguments={"i": i})])
             for i in range(2)]
    s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
    engine.set_script(s["session_id"], Script(turns=[*turns, Turn(content="All done.")]))
    run_agent(s["base_url"], s["secret"], stream=True, echo="opencode")
    records = admin.records(s["session_id"])
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact"]
    modes = [r["metadata"]["prompt_mode"] for r in records[1:]]
    assert all(m["continued"] and "reasoning_field_renamed" in m["equivalences"] for m in modes)


def test_a_template_that_rerenders_the_previous_turn_keeps_the_exact_checkpoint(tmp_path) -> None:
    """Qwen3's template drops an empty think block from an assistant turn once a tool result follows:
    full history drifts there; incremental continues the turn as sampled and says the full render differs."""
    from pathlib import Path

    import trl

    from openenv_harness.recorder import RecorderConfig
    from openenv_harness.testing.engine import EngineConfig

    from agentloop import ADMIN

    template = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"
    with EngineServer(EngineConfig(chat_template=template)) as engine, RecorderServer(RecorderConfig(
            store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        full = _run(engine, admin, "full_history")
        assert [r["metadata"]["fidelity"]["class"] for r in full] == ["root"] + ["replay_drift"] * 3
        s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(s["session_id"], tool_script(3))
        run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
        records = admin.records(s["session_id"])
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    modes = [r["metadata"]["prompt_mode"] for r in records[1:]]
    assert all(m["continued"] and m["template_rerenders_turn"] for m in modes)
    assert all(m["full_render_diff"]["identical"] is False for m in modes)
    for prev, rec in zip(records, records[1:]):
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain



def test_derender_gets_the_request_settings_and_only_the_historys_tool_call_turns(tmp_path) -> None:
    """What derender reads of the chat request (``sample_parse.derender_chat_request``): all of its
    settings, and of its history only the assistant turns with tool calls (the count a tool-call id
    scheme numbers new calls after); the rest of the history is not sent again. The engine's own
    render and derender handlers are wrapped to see what arrives."""
    from openenv_harness.recorder import RecorderConfig
    from openenv_harness.testing.engine import SESSION_HEADER

    from agentloop import ADMIN

    seen: dict[str, list[dict]] = {"render": [], "derender": []}
    with EngineServer() as engine:
        for name in seen:
            path = f"/v1/chat/completions/{name}"
            handler = engine.app.lean_routes[path]

            async def capture(request, handler=handler, name=name):  # type: ignore[no-untyped-def]
                if request.headers.get(SESSION_HEADER):  # not the template certification's renders
                    seen[name].append(orjson.loads(await request.body()))
                return await handler(request)
            engine.app.lean_routes[path] = capture
        with RecorderServer(RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url,
                                           admin_token=ADMIN)) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
            s = admin.create_session(prompt_mode="incremental")
            engine.set_script(s["session_id"], tool_script(3))  # type: ignore[arg-type]
            run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
            records = admin.records(s["session_id"])
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    full = [b for b in seen["render"] if b["messages"][0].get("content") != "."]  # not the probe's renders
    assert len(seen["derender"]) == len(full) == 3
    for rendered, derender in zip(full, seen["derender"]):
        chat = derender["chat_request"]
        assert {k: v for k, v in chat.items() if k not in ("messages", "stream")} == \
            {k: v for k, v in rendered.items() if k != "messages"}
        assert chat["messages"] == [m for m in rendered["messages"]
                                    if m["role"] == "assistant" and m.get("tool_calls")]
        assert 0 < len(chat["messages"]) < len(rendered["messages"])


def test_the_probe_is_rendered_without_the_tool_list_unless_the_template_needs_it(tmp_path) -> None:
    """The probe's tool list lands in the part cut off, so it is not rendered (on the real vLLM, 14-16
    ms against 2-3 ms per suffix render with OpenCode's tools). A template that renders the new messages
    differently without tools is found at the certification: that call renders its suffix again with
    the tools, still continues exactly, and the engine's later calls render with them from the start."""
    from pathlib import Path

    from openenv_harness.recorder import RecorderConfig
    from openenv_harness.testing.engine import EngineConfig, SESSION_HEADER

    from agentloop import ADMIN

    reference = Path(__file__).parents[3] / "openenv_harness" / "testing" / "engine" / "chat_template.jinja"
    plain = reference.read_text()
    marked = plain.replace("{{- render_text(message.content) + '<|im_end|>\\n' -}}",
                           "{{- ('(with tools) ' if tools and message.role == 'tool' else '') + "
                           "render_text(message.content) + '<|im_end|>\\n' -}}")
    assert marked != plain
    runs = {}
    for name, text in (("plain", plain), ("needs_tools", marked)):
        template = tmp_path / f"{name}.jinja"
        template.write_text(text)
        probes: dict[str, list[bool]] = {}  # per session: the probe's renders, with the tool list or not
        with EngineServer(EngineConfig(chat_template=template)) as engine:
            handler = engine.app.lean_routes["/v1/chat/completions/render"]

            async def capture(request, handler=handler, probes=probes):  # type: ignore[no-untyped-def]
                body = orjson.loads(await request.body())
                session = request.headers.get(SESSION_HEADER)
                if session and body["messages"][0].get("content") == ".":
                    probes.setdefault(session, []).append(bool(body.get("tools")))
                return await handler(request)
            engine.app.lean_routes["/v1/chat/completions/render"] = capture
            with RecorderServer(RecorderConfig(store_path=str(tmp_path / f"{name}.db"), engine_url=engine.url,
                                               admin_token=ADMIN)) as rec, RecorderClient(rec.url, ADMIN) as admin:
                sessions = []
                for _ in range(2):  # the second session's calls show what the engine was remembered to need
                    s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
                    engine.set_script(s["session_id"], tool_script(3, spaced_args=True))
                    run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
                    sessions.append((admin.records(s["session_id"]), probes.get(s["session_id"], [])))
        runs[name] = sessions
    for name, sessions in runs.items():
        for records, _ in sessions:
            assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3, name
            assert all(r["metadata"]["prompt_mode"]["continued"] for r in records[1:]), name
            assert [r["metadata"]["prompt_mode"]["probe_rendered_tools"] for r in records[1:]] == \
                [name == "needs_tools"] * 3
    # the probe's renders (prefix, then probe + new messages), with or without the tool list
    (_, plain_first), (_, plain_second) = runs["plain"]
    assert plain_first == [False, False, False, False] and plain_second == [False] * 3  # prefix memoized
    (_, first), (_, second) = runs["needs_tools"]
    assert first == [False, False, True, True, True, True]  # found at the first continued call, rendered again
    assert second == [True] * 3
