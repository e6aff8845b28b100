"""How much recorder code one agent call runs through: files and functions, on the chat loop.

Why: the recorder is read one call at a time -- a user asking why a record looks as it does follows
the call from the socket to the stored record. This counts what that reader meets: every
``openenv_harness`` function the recorder's event-loop thread enters while serving one call (from
the request's first byte to the reply's last), and the files they are in. A Python profile hook is
installed on the recorder's loop thread only for that call (``sys.setprofile`` run on the loop);
work handed to other threads (the store's indexer, ``to_thread`` reads) is not counted. The engine
is the reference engine on its own thread, so none of its code is counted either.

Three calls, each the second of its session (the first warms the session's caches): a plain chat
call (Pi, OpenCode), an incremental-mode call that continues its chain, and an Anthropic Messages
call (Claude Code).

    python benchmarks/call_trace.py [--refs REF,REF] [--files]

``--refs``: the same three calls on other versions (``git archive REF openenv_harness``, run beside
this tree's), each in a process of its own. Comprehensions and lambdas count as part of the function
they are written in.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                          "required": ["command"]}}}]


CASES = ("chat", "incremental", "anthropic")


class LoopTrace:
    """The functions the recorder's loop thread enters between ``start`` and ``stop``."""

    def __init__(self, loop: Any, root: Path) -> None:
        self._loop = loop
        self._root = str(root)
        self._package = str(root / "openenv_harness") + "/"
        self.functions: set[tuple[str, str]] = set()

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            # a comprehension, generator expression or lambda is part of the function it is written in
            if code.co_filename.startswith(self._package) and not code.co_name.startswith("<"):
                self.functions.add((code.co_filename[len(self._root) + 1:], code.co_qualname))

    def _on_loop(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise TimeoutError("the recorder's loop did not run the profile hook change")

    def start(self) -> None:
        self.functions.clear()
        self._on_loop(lambda: sys.setprofile(self._hook))

    def stop(self) -> None:
        self._on_loop(lambda: sys.setprofile(None))

    def summary(self) -> dict[str, Any]:
        files = sorted({f for f, _ in self.functions})
        return {"files": len(files), "functions": len(self.functions), "file_list": files}


def _chat(url: str, secret: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "List the files."}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"Looking ({i})."}, {"role": "user", "content": f"go on {i}"}]
    return {"url": f"{url}/v1/chat/completions", "headers": {"authorization": f"Bearer {secret}"},
            "json": {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 8}}


def _anthropic(url: str, secret: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": [{"type": "text", "text": f"Looking ({i})."}]},
                     {"role": "user", "content": f"go on {i}"}]
    tools = [{"name": "bash", "description": "run a command", "input_schema": TOOLS[0]["function"]["parameters"]}]
    return {"url": f"{url}/v1/messages", "headers": {"x-api-key": secret, "anthropic-version": "2023-06-01"},
            "json": {"model": "m", "max_tokens": 8, "system": "You are a coding agent.", "messages": messages,
                     "tools": tools}}


def measure() -> dict[str, Any]:
    import openenv_harness
    from openenv_harness.recorder.client import RecorderClient
    from openenv_harness.recorder.server import RecorderServer
    from openenv_harness.testing.engine import EngineServer

    try:
        from openenv_harness.recorder.config import RecorderConfig
    except ImportError:  # a tree where the settings live with the context
        from openenv_harness.recorder.context import RecorderConfig  # type: ignore[no-redef]

    import tempfile

    root = Path(openenv_harness.__file__).parent.parent
    out: dict[str, Any] = {"tree": str(root)}
    with tempfile.TemporaryDirectory() as tmp, EngineServer() as engine:
        config = RecorderConfig(store_path=f"{tmp}/records.db", engine_url=engine.url, admin_token="t" * 32,
                                stream_keepalive_s=0)
        with RecorderServer(config) as server, RecorderClient(server.url, "t" * 32) as admin, \
                httpx.Client(timeout=60) as http:
            loop = server.loop
            trace = LoopTrace(loop, root)
            cases = {"chat": ({}, _chat), "incremental": ({"prompt_mode": "incremental"}, _chat),
                     "anthropic": ({}, _anthropic)}
            for name, (spec, request) in cases.items():
                session = admin.create_session(**spec)
                first = http.post(**request(server.url, session["secret"], 0))
                first.raise_for_status()
                if name == "incremental":  # the next call continues the chain the first one left
                    reply = first.json()["choices"][0]["message"]
                    call = _chat(server.url, session["secret"], 0)
                    call["json"]["messages"] += [{k: v for k, v in reply.items() if v is not None},
                                                 {"role": "user", "content": "go on"}]
                else:
                    call = request(server.url, session["secret"], 1)
                trace.start()
                try:
                    second = http.post(**call)
                finally:
                    trace.stop()
                second.raise_for_status()
                out[name] = trace.summary()
    return out


def _other_tree(ref: str) -> dict[str, Any]:
    import os
    import subprocess

    import procs

    tree = procs.baseline_tree(ref, prefix="oeh-trace-")
    done = subprocess.run([sys.executable, __file__, "--files"], cwd=tree, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(tree)})
    if done.returncode != 0:
        raise RuntimeError(f"{ref}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["tree"] = ref
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", action="store_true", help="list the files each call runs through")
    p.add_argument("--refs", default="", help="other versions to trace the same calls on (git refs, comma-separated)")
    args = p.parse_args(argv)
    results = [_other_tree(ref) for ref in args.refs.split(",") if ref] + [measure()]
    if args.refs:
        print(f"| tree | {' | '.join(c + ' (files / functions)' for c in CASES)} |")
        print("|---|" + "---|" * len(CASES))
        for r in results:
            print(f"| `{r['tree']}` | " + " | ".join(f"{r[c]['files']} / {r[c]['functions']}" for c in CASES) + " |")
        return
    result = results[-1]
    if not args.files:
        for case in CASES:
            result[case].pop("file_list")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
