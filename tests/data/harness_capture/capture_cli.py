"""Re-capture what the real Codex / Claude Code CLIs send, configured by the project's own presets.

    OPENENV_HARNESS_NODE_PREFIX=... python tests/data/harness_capture/capture_cli.py codex basic
    ... capture_cli.py claude-code title      # interactive run under script(1): the title call

Each scenario starts ``capture_server.py`` (a scripted stand-in for the model provider), prepares
the CLI exactly as a rollout does (``HarnessPreset.prepare``: config files, environment, argv),
runs it in a fresh home and work directory, and writes ``<harness>/<scenario>/requests/*.json``
next to this file, with the temporary directories rewritten to ``/home/agent`` and
``/home/agent/task`` and the API key shortened to a prefix. ``rc.txt`` keeps the exit status.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openenv_harness.harnesses import HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.install import binary_path, default_node_prefix, node_bin_dir
from openenv_harness.sandbox.base import ModelEndpoint

HERE = Path(__file__).parent
PROMPT = "Run echo hi and tell me what it printed"
#: scenario -> (server flags, prompt, preset option overrides, interactive, max requests kept)
SCENARIOS: dict[str, tuple[list[str], str, dict, bool, int]] = {
    "basic": ([], PROMPT, {}, False, 10),
    "reasoning": (["--reasoning"], PROMPT, {}, False, 10),
    "compact": ([], PROMPT, {"compaction": True, "config_overrides": {"model_auto_compact_token_limit": 50}}, False, 4),
    "count_tokens": ([], "/context", {}, False, 6),
    "title": ([], PROMPT, {}, True, 4),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture(harness: str, scenario: str) -> Path:
    flags, prompt, overrides, interactive, keep = SCENARIOS[scenario]
    preset = get_preset(harness)
    out = HERE / harness / scenario
    with tempfile.TemporaryDirectory(prefix="capture-") as tmp:
        root = Path(tmp)
        home, work, log = root / "home", root / "work", root / "log"
        for d in (home, work, log):
            d.mkdir()
        port = _port()
        server = subprocess.Popen([sys.executable, str(HERE / "capture_server.py"), "--port", str(port),
                                   "--logdir", str(log), *flags], stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            endpoint = ModelEndpoint(f"http://127.0.0.1:{port}/rollout/{scenario}/v1", "oeh-capture-secret")
            setup = HarnessSetup(endpoint=endpoint, model="policy-model", workdir=str(work), home=str(home),
                                 options=HarnessOptions(**overrides))
            spec = preset.prepare(setup, prompt, str(binary_path(preset, default_node_prefix())))
            for path, content in spec.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(content)
            env = {"PATH": f"{node_bin_dir()}:/usr/bin:/bin", "LANG": "C.UTF-8", **spec.env}
            argv = spec.argv
            if interactive:  # no -p: a terminal session; onboarding and trust answered in advance
                state = {"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True,
                         "projects": {str(work): {"hasTrustDialogAccepted": True}}}
                (home / ".claude" / ".claude.json").write_text(json.dumps(state))
                argv = ["script", "-qfc", " ".join([argv[0], "--dangerously-skip-permissions", f"'{prompt}'"]),
                        "/dev/null"]
                env["TERM"] = "xterm"
                # two of the preset's variables turn the title call off; this scenario shows it
                for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE"):
                    env.pop(name, None)
            started = time.monotonic()
            try:
                done = subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=25 if interactive or scenario == "compact" else 120)
                rc = str(done.returncode)
            except subprocess.TimeoutExpired:
                rc = "timeout (killed)"
            wall = time.monotonic() - started
        finally:
            server.terminate()
            server.wait(timeout=10)
        if out.exists():
            shutil.rmtree(out)
        (out / "requests").mkdir(parents=True)
        files = sorted(log.iterdir())
        for n, src in enumerate(files[:keep], start=1):
            text = src.read_text().replace(str(work), "/home/agent/task").replace(str(home), "/home/agent")
            (out / "requests" / f"{n:03d}-{src.name.split('-', 1)[1]}").write_text(text)
        (out / "rc.txt").write_text(f"exit {rc}, {wall:.1f} s, {len(files)} requests (first {keep} kept)\n")
    return out


if __name__ == "__main__":
    os.environ.setdefault("OPENENV_HARNESS_NODE_PREFIX", str(default_node_prefix()))
    print(capture(sys.argv[1], sys.argv[2]))
