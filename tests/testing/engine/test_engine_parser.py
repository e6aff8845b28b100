"""Engine-side parsing: reasoning, content and Hermes-style tool calls out of sampled text."""

from __future__ import annotations

import json

from openenv_harness.testing.engine.parser import parse_output


def test_plain_content() -> None:
    parsed = parse_output("All done.", parse_tools=True)
    assert (parsed.reasoning, parsed.content, parsed.tool_calls) == (None, "All done.", [])
    assert parsed.content_span == (0, 9)


def test_reasoning_content_and_tool_calls_strip_exactly_the_template_glue() -> None:
    text = ('<think>\nPlan it.\n</think>\n\nRunning ls.\n<tool_call>\n{"name": "bash", "arguments": '
            '{"command":"ls"}}\n</tool_call>\n<tool_call>\n{"name": "read", "arguments": {"path": "é"}}\n</tool_call>')
    parsed = parse_output(text, parse_tools=True)
    assert parsed.reasoning == "Plan it."
    assert parsed.content == "Running ls."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("bash", json.dumps({"command": "ls"})), ("read", '{"path": "é"}')]
    start, end = parsed.tool_calls[0].arguments_span
    assert text[start:end] == '{"command":"ls"}'
    assert text[slice(*parsed.reasoning_span)] == "Plan it."


def test_tool_calls_without_content() -> None:
    parsed = parse_output('<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>', parse_tools=True)
    assert parsed.content is None and parsed.content_span is None
    assert parsed.tool_calls[0].arguments == "{}"


def test_malformed_tool_call_falls_back_to_content() -> None:
    for text in ('<tool_call>\n{"name": "bash", "arguments": {oops}\n</tool_call>',
                 '<tool_call>\n{"name": "bash", "arguments": {}}',
                 '<tool_call>\n["not", "an", "object"]\n</tool_call>'):
        parsed = parse_output(text, parse_tools=True)
        assert parsed.tool_calls == [] and parsed.content == text


def test_tool_markup_is_content_when_the_request_had_no_tools() -> None:
    text = '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    parsed = parse_output(text, parse_tools=False)
    assert parsed.tool_calls == [] and parsed.content == text


def test_unfinished_reasoning_is_all_reasoning() -> None:
    parsed = parse_output("<think>\nStill thinking about", parse_tools=True)
    assert parsed.reasoning == "Still thinking about" and parsed.content is None


def test_empty_reasoning_is_none() -> None:
    parsed = parse_output("<think>\n\n</think>\n\nHi", parse_tools=True)
    assert parsed.reasoning is None and parsed.content == "Hi"


def test_empty_output_has_empty_content_unless_tools_or_reasoning_took_its_place() -> None:
    assert parse_output("", parse_tools=True).content == ""
    assert parse_output("<think>\nx\n</think>\n\n", parse_tools=True).content is None
    assert parse_output('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', parse_tools=True).content is None


def test_qwen3_xml_tool_calls_come_back_with_string_values() -> None:
    text = ("Checking.\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
            "<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=read>\n"
            "<parameter=path>\nline one\nline two\n</parameter>\n</function>\n</tool_call>")
    parsed = parse_output(text, parse_tools=True, tool_parser="qwen3_xml")
    assert parsed.content == "Checking."  # the template's blank line before the first call is glue
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("bash", {"command": "ls -la", "timeout": "5"}), ("read", {"path": "line one\nline two"})]
    first = parsed.tool_calls[0]
    assert text[first.name_end - len("<function=bash>"): first.name_end] == "<function=bash>"
    malformed = parse_output("<tool_call>\n<parameter=x>\n1\n</parameter>\n</tool_call>", parse_tools=True,
                             tool_parser="qwen3_xml")
    assert malformed.tool_calls == [] and malformed.content.startswith("<tool_call>")


def test_a_hermes_call_is_complete_once_its_name_is() -> None:
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    [call] = parse_output(text, parse_tools=True).tool_calls
    assert text[: call.name_end].endswith('"name": "bash"')


def test_reasoning_opened_by_the_prompt_and_no_reasoning_parser() -> None:
    opened = parse_output("Plan it.\n</think>\n\nDone.", parse_tools=True, open_think=True)
    assert (opened.reasoning, opened.content) == ("Plan it.", "Done.")
    unfinished = parse_output("Still going", parse_tools=True, open_think=True)
    assert (unfinished.reasoning, unfinished.content) == ("Still going", None)
    raw = parse_output("<think>\nPlan.\n</think>\n\nDone.", parse_tools=True, reasoning=False)
    assert (raw.reasoning, raw.content) == (None, "<think>\nPlan.\n</think>\n\nDone.")
