"""A small built-in task set: tiny repositories with a failing test, each with its own verifier.

Each task also carries a scripted solution for the embedded reference engine, written with the one
tool every supported agent has: a shell. The scripts name it as Pi and OpenCode do (``bash`` with a
``command`` argument); ``script_for`` writes the same calls for an agent whose shell tool is named
otherwise (Codex's ``exec_command`` with ``cmd``, Claude Code's ``Bash``), with the command rewritten
where an agent's shell runs a form as something else (the preset's ``shell_rewrites``), and for an agent
that ends only on a submit command (mini-swe-agent) the final text turn also runs that command, so the
demo and the tests drive every real agent through real multi-turn tool use. Tool-call arguments are JSON objects:
the engine samples them as its template writes them and, like vLLM, parses an agent's replay before
rendering it again, so a canonical-sampling run chains exactly.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openenv_harness.rollout.tasks import Task

_VERIFY = "python3 -m unittest -q 2>&1"


def _bash(command: str) -> dict:
    # object arguments: sampled as the template's tojson writes them, which is also what vLLM re-renders
    # from an agent's (compact) replay once it has parsed it -- so the scripted chain stays clean
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


FIX_ADD = Task(
    id="fix-add",
    instruction=(
        "The tests in test_calc.py fail. Fix the bug in calc.py so that `python3 -m unittest -q` passes. "
        "Do not change the tests."
    ),
    files={
        "calc.py": 'def add(a, b):\n    """Return the sum of a and b."""\n    return a - b\n',
        "test_calc.py": (
            "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
            "    def test_negative(self):\n        self.assertEqual(add(-1, 1), 0)\n"
        ),
    },
    verify_command=_VERIFY,
    reference_script=[
        _bash("cat calc.py test_calc.py"),
        _bash("sed -i 's/return a - b/return a + b/' calc.py"),
        _bash("python3 -m unittest -q"),
        {"content": "Fixed add() in calc.py: it subtracted instead of adding. The tests pass now."},
    ],
)

FIX_WORDCOUNT = Task(
    id="fix-wordcount",
    instruction=(
        "`python3 -m unittest -q` fails: count_words in words.py miscounts. Fix words.py (not the tests)."
    ),
    files={
        "words.py": 'def count_words(text):\n    """Number of whitespace-separated words."""\n    return len(text.split(" "))\n',
        "test_words.py": (
            "import unittest\n\nfrom words import count_words\n\n\nclass WordsTest(unittest.TestCase):\n"
            "    def test_spaces(self):\n        self.assertEqual(count_words('a  b\\tc\\n'), 3)\n\n"
            "    def test_empty(self):\n        self.assertEqual(count_words(''), 0)\n"
        ),
    },
    verify_command=_VERIFY,
    reference_script=[
        _bash("cat words.py"),
        _bash("sed -i 's/len(text.split(\" \"))/len(text.split())/' words.py"),
        _bash("python3 -m unittest -q"),
        {"content": "count_words now splits on any whitespace; both tests pass."},
    ],
)

WRITE_GREETING = Task(
    id="write-greeting",
    instruction="Create a file greeting.txt containing exactly the line: hello from the agent",
    files={
        "test_greeting.py": (
            "import unittest\n\n\nclass GreetingTest(unittest.TestCase):\n    def test_file(self):\n"
            "        with open('greeting.txt') as f:\n"
            "            self.assertEqual(f.read().strip(), 'hello from the agent')\n"
        ),
    },
    verify_command=_VERIFY,
    reference_script=[
        _bash("printf 'hello from the agent\\n' > greeting.txt && cat greeting.txt"),
        {"content": "Created greeting.txt."},
    ],
)

BUILTIN_TASKS: dict[str, Task] = {t.id: t for t in (FIX_ADD, FIX_WORDCOUNT, WRITE_GREETING)}


def _rewritten(command: str, rewrites: tuple[tuple[str, str], ...]) -> str:
    for pattern, replacement in rewrites:
        command = re.sub(pattern, replacement, command)
    return command


def _rewrite_text(args: str, rewrites: tuple[tuple[str, str], ...]) -> str:
    """Argument text with its ``command`` value rewritten and every other character kept as sampled."""
    try:
        command = json.loads(args).get("command")
    except (ValueError, AttributeError):
        return args
    if not isinstance(command, str) or _rewritten(command, rewrites) == command:
        return args
    return args.replace(json.dumps(command)[1:-1], json.dumps(_rewritten(command, rewrites))[1:-1], 1)


def script_for(turns: list[Any], harness: str) -> list[dict[str, Any]]:
    """Scripted turns (dicts or ``Turn`` models) with their ``bash`` calls written for ``harness``'s shell tool.

    For an agent with a ``submit_command``, a last turn of text alone (the final answer) keeps its
    text and calls the shell with that command: the agent's only way to end its run."""
    from openenv_harness.harnesses.registry import get_preset

    preset = get_preset(harness)
    name, argument = preset.shell_tool
    rewrites = preset.shell_rewrites
    out = []
    for index, turn in enumerate(turns):
        data = turn.model_dump(exclude_none=True) if hasattr(turn, "model_dump") else dict(turn)
        if preset.submit_command and index == len(turns) - 1 and not data.get("tool_calls"):
            data["tool_calls"] = [{"name": "bash", "arguments": {"command": preset.submit_command}}]
        calls = []
        for call in data.get("tool_calls") or []:
            call = dict(call)
            if call.get("name") == "bash" and ((name, argument) != ("bash", "command") or rewrites):
                args = call.get("arguments")
                call["name"] = name
                if isinstance(args, str):  # the text is what the model samples: only the key is renamed
                    args = _rewrite_text(args, rewrites) if rewrites else args
                    call["arguments"] = re.sub(r'"command"(\s*):', lambda m: f'"{argument}"{m.group(1)}:', args,
                                               count=1)
                else:
                    call["arguments"] = {argument if k == "command" else k:
                                         (_rewritten(v, rewrites) if k == "command" and isinstance(v, str) else v)
                                         for k, v in (args or {}).items()}
            calls.append(call)
        if calls:
            data["tool_calls"] = calls
        out.append(data)
    return out


def reference_model_name(task_id: str, harness: str | None = None) -> str:
    """The model name a rollout of ``task_id`` by ``harness`` asks the reference engine for: one per
    shell-tool spelling (and ``/submit`` where the script ends with the agent's submit command), so
    each agent's scripted tool calls name its own shell tool (and one of its own for an agent whose
    scripted commands are rewritten)."""
    if harness is None:
        return f"reference/{task_id}"
    from openenv_harness.harnesses.registry import get_preset

    preset = get_preset(harness)
    if preset.shell_rewrites:
        return f"reference/{task_id}/{preset.name}"
    name, _ = preset.shell_tool
    parts = ([] if name == "bash" else [name]) + (["submit"] if preset.submit_command else [])
    return "/".join([f"reference/{task_id}", *parts])


def builtin_task_scripts(tasks: list[Task] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Scripted turns of each built-in task (or of ``tasks``) for every agent, by the model name
    ``reference_model_name`` gives: what the reference engine serves so the real agents solve them."""
    from openenv_harness.harnesses.registry import list_presets

    out: dict[str, list[dict[str, Any]]] = {}
    for task in tasks if tasks is not None else list(BUILTIN_TASKS.values()):
        turns = task.reference_script or [{"content": "I cannot solve this task."}]
        for preset in list_presets():
            out[reference_model_name(task.id, preset.name)] = script_for(turns, preset.name)
    return out
