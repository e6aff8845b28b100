"""How often the real 0.5B model acts -- calls a declared tool -- when nothing constrains it, and what
each piece of the unconstrained setup adds.

Pi's own first request (its captured system prompt and four tools) with a task from the generated
family is sent to the real vLLM at temperature 1 (the training policy), ``n`` samples per variant:
with Pi's prompt as it is, and with the model's tool-call hint appended (what ``--append-system-prompt``
does). Each sample's text is read back from its tokens and classified: a tool call in the template's
``<tool_call>`` tags (what vLLM's Hermes parser reads), a call written as JSON without the tags (what
only the ``openenv_json`` parser reads: fenced, bare, or a brace short), JSON naming no declared tool,
or prose. No decoding constraint anywhere: every sampled id is the policy's own.

Run: ``python benchmarks/tool_acting.py --port N [--n 32]`` against ``python -m openenv_harness.engine
serve --port N``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openenv_harness.engine.json_tool_calls import parse_json_tool_calls  # noqa: E402
from openenv_harness.engine.model import QWEN25_CODER_05B  # noqa: E402
from openenv_harness.rollout.task_family import generate  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "harness_capture" / "pi" / "basic" / "requests"


def pi_request(instruction: str, hint: str | None) -> dict[str, Any]:
    body = json.loads((CAPTURE / "001-POST-rollout_basic_v1_chat_completions.json").read_text())["body"]
    messages = [dict(m) for m in body["messages"]]
    if hint:
        messages[0]["content"] += hint
    messages[-1] = {"role": "user", "content": [{"type": "text", "text": instruction}]}
    return {"model": QWEN25_CODER_05B.served_name, "messages": messages, "tools": body["tools"]}


def classify(text: str, tools: list[str]) -> str:
    if "<tool_call>" in text:
        return "tagged call (Hermes reads it)"
    if parse_json_tool_calls(text, tools, ["<|im_end|>", "<|endoftext|>"]).calls:
        return "untagged JSON call (openenv_json only)"
    if parse_json_tool_calls(text, None, ["<|im_end|>", "<|endoftext|>"]).calls:
        return "JSON call to an undeclared tool"
    return "prose"


def measure(url: str, n: int, hint: str | None, tasks: list[Any]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    per_task = max(1, n // len(tasks))
    for task in tasks:
        body = pi_request(task.instruction, hint) | {"temperature": 1.0, "n": per_task, "max_tokens": 96,
                                                      "logprobs": True, "seed": 0}
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=900).json()
        tools = [t["function"]["name"] for t in body["tools"]]
        for choice in reply["choices"]:
            text = "".join(t["token"] for t in choice["logprobs"]["content"])
            counts[classify(text, tools)] += 1
            counts["parsed as a tool call by the engine"] += bool(choice["message"].get("tool_calls"))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n", type=int, default=32, help="samples per variant")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    tasks = generate(4, seed=7, levels=(1, 2))
    rows = {"Pi's prompt as it is": measure(url, args.n, None, tasks),
            "+ the tool-call hint": measure(url, args.n, QWEN25_CODER_05B.tool_call_hint, tasks)}
    kinds = ["tagged call (Hermes reads it)", "untagged JSON call (openenv_json only)",
             "JSON call to an undeclared tool", "prose", "parsed as a tool call by the engine"]
    print("| variant | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for name, counts in rows.items():
        total = sum(counts[k] for k in kinds[:4])
        print(f"| {name} | " + " | ".join(f"{counts[k]}/{total}" for k in kinds) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
