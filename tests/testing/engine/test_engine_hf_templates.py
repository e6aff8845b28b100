"""Any Hugging Face chat template, with the real Qwen2.5 tokenizer: TRL 1.16's own templates (read from
the installed package), rendered exactly as transformers renders them, and served end to end with the
parsers their model families need (hermes JSON, Qwen3.5's XML tool calls, ``<think>`` reasoning)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn, agent_echo
from openenv_harness.testing.engine.messages import prepare_messages, prepare_tools
from openenv_harness.testing.engine.template import ChatTemplate, load_chat_template

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "Listing.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    {"role": "user", "content": "Thanks."},
]
TOOL_TURN = Turn(reasoning="I should list them.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])
SCRIPT = Script(turns=[TOOL_TURN, Turn(content="Found a.txt.")])


def _trl_templates() -> list[Path]:
    import trl

    return sorted((Path(trl.__file__).parent / "chat_templates").glob("*.jinja"))


@pytest.fixture(scope="module")
def hf(qwen_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_folder))


@pytest.mark.parametrize("path", _trl_templates(), ids=lambda p: p.name)
def test_every_trl_template_renders_as_transformers_renders_it(path: Path, qwen_folder: Path, hf: Any) -> None:
    template = load_chat_template(path, qwen_folder)
    messages = prepare_messages(CONVERSATION, content_format=template.content_format,
                                developer_role=template.knows_developer)
    tools = prepare_tools(TOOLS)
    try:
        expected = hf.apply_chat_template(messages, tools=tools, chat_template=path.read_text(), tokenize=False,
                                          add_generation_prompt=True)
    except Exception as refused:  # a template that rejects this conversation must reject it the same way
        with pytest.raises(type(refused), match=re.escape(str(refused))):
            template.render(messages, tools, add_generation_prompt=True)
        return
    ours = template.render(messages, tools, add_generation_prompt=True)
    assert ours == expected
    engine_tokenizer = EngineServer(EngineConfig(tokenizer=qwen_folder)).app.state.engine.tokenizer
    assert engine_tokenizer.encode(ours) == hf(ours, add_special_tokens=False)["input_ids"]


def test_generation_tags_render_their_body_and_training_templates_match_the_originals(qwen_folder: Path,
                                                                                      wire) -> None:
    assert ChatTemplate("a{% generation %}{{ 'b' }}{% endgeneration %}c").render([]) == "abc"
    training = load_chat_template(wire.trl_template("qwen3_training.jinja"), qwen_folder)
    original = load_chat_template(wire.trl_template("qwen3.jinja"), qwen_folder)
    assert "{% generation %}" in training.source.replace("{%- generation %}", "{% generation %}")
    messages = prepare_messages(CONVERSATION[:2])
    assert training.render(messages, add_generation_prompt=True) == original.render(messages, add_generation_prompt=True)


def test_content_format_is_read_off_the_template(qwen_folder: Path, wire) -> None:
    formats = {name: load_chat_template(wire.trl_template(name)).content_format
               for name in ("qwen2_5.jinja", "qwen3.jinja", "qwen3_5_think.jinja", "gemma3.jinja", "llama3.jinja")}
    assert formats == {"qwen2_5.jinja": "string", "qwen3.jinja": "string", "qwen3_5_think.jinja": "openai",
                       "gemma3.jinja": "openai", "llama3.jinja": "string"}
    assert load_chat_template(None, qwen_folder).content_format == "string"  # the model's own Qwen2.5 template


def _serve(qwen_folder: Path, **settings: Any) -> EngineServer:
    return EngineServer(EngineConfig.for_model(qwen_folder, default_script=SCRIPT, **settings))


def _chat(engine: EngineServer, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "tools": TOOLS, "return_token_ids": True, **extra}
    reply = httpx.post(engine.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _assert_clean_replay(engine: EngineServer, style: str) -> dict[str, Any]:
    """Turn 1 sampled, echoed the way the agent does, turn 2's prompt must extend prompt + sample."""
    user = [{"role": "user", "content": "List the files."}]
    first = _chat(engine, user)
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    echoed = user + [agent_echo(message, style), {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    second = _chat(engine, echoed)
    held = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(held)] == held, style
    assert second["choices"][0]["message"]["content"] == "Found a.txt."
    return first


def test_trl_qwen3_template_with_hermes_and_think_parsers(qwen_folder: Path, wire) -> None:
    with _serve(qwen_folder, chat_template=wire.trl_template("qwen3.jinja")) as engine:
        first = _assert_clean_replay(engine, "pi")  # Pi replays "reasoning": rendered, so the chain is clean
        message = first["choices"][0]["message"]
        assert message["reasoning"] == "I should list them." and message["content"] is None
        assert message["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
        assert 151657 in first["choices"][0]["token_ids"], "the real <tool_call> id"
        _assert_clean_replay(engine, "opencode")  # "reasoning_content": renamed by vLLM 0.32's chat route


def test_trl_qwen3_5_template_with_xml_tool_calls_and_an_open_think_block(qwen_folder: Path, wire) -> None:
    with _serve(qwen_folder, chat_template=wire.trl_template("qwen3_5_think.jinja"),
                tool_call_parser="qwen3_xml") as engine:
        first = _assert_clean_replay(engine, "pi")
        choice = first["choices"][0]
        text = engine.app.state.engine.tokenizer.decode(choice["token_ids"])
        assert text.startswith("I should list them.\n</think>")  # the prompt opened the think block
        assert "<function=bash>\n<parameter=command>\nls\n</parameter>" in text
        message = choice["message"]
        assert message["reasoning"] == "I should list them." and choice["finish_reason"] == "tool_calls"
        assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
        events = wire.read_sse(engine, {"messages": [{"role": "user", "content": "List the files."}],
                                        "tools": TOOLS})
        calls = [c for e in events[1:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])]
        assert calls[0] == {"id": calls[0]["id"], "type": "function", "index": 0, "function": {"name": "bash"}}
        assert "".join(c["function"].get("arguments", "") for c in calls) == '{"command": "ls"}'


def test_the_models_own_template_and_generation_config(qwen_folder: Path) -> None:
    with _serve(qwen_folder) as engine:
        info = engine.info()
        assert info["chat_template"] == "hf model" and info["tokenizer"].endswith("tokenizer.json")
        card = httpx.get(engine.url + "/v1/models").json()["data"][0]
        assert card["root"] == str(qwen_folder)
        first = _assert_clean_replay(engine, "pi")
        # Qwen2.5's own template renders no reasoning, so a Qwen2.5 model writes none
        assert first["choices"][0]["message"]["reasoning"] is None
        sampling = engine.requests()[-1]["sampling"]
        assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (0.7, 0.8, 20)
